"""DDP with gradient_as_bucket_view: each bucket is one persistent flat buffer and every .grad is a view of it.

When a gradient is ready, the hook copies it into its slot of the bucket's buffer (once per fresh .grad) and
makes .grad that slot, so later backward passes accumulate straight into the buffer.  The all-reduce runs in
place on the buffer, and finish_gradient_sync divides the buffer once: nothing is copied back.  The
timeline is computed with itertools.accumulate over the buckets' durations.
"""
import itertools

import torch
import torch.distributed as dist
from torch import nn


def make_buckets(sizes, cap):
    buckets = []
    for i in range(len(sizes) - 1, -1, -1):
        if buckets and sum(sizes[j] for j in buckets[-1]) + sizes[i] <= cap:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def comm_timeline(ready, buckets, sizes, bw, latency=0.0):
    def advance(span, bucket):
        start = max(span[1], *(ready[i] for i in bucket))
        return (start, start + latency + sum(sizes[i] for i in bucket) / bw)
    return list(itertools.accumulate(buckets, advance, initial=(0.0, 0.0)))[1:]


def exposed_comm(ready, buckets, sizes, bw, latency=0.0):
    spans = comm_timeline(ready, buckets, sizes, bw, latency)
    return float(max(0.0, spans[-1][1] - max(ready))) if spans else 0.0


class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_cap_bytes):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = make_buckets([p.numel() * p.element_size() for p in self.params], bucket_cap_bytes)
        self._buffers = []
        self._slot = {}
        for b, bucket in enumerate(self.buckets):
            params = [self.params[i] for i in bucket]
            buffer = params[0].new_zeros(sum(p.numel() for p in params))
            self._buffers.append(buffer)
            for i, piece in zip(bucket, buffer.split([p.numel() for p in params])):
                self._slot[i] = (b, piece.view_as(self.params[i]))
        self._arrived = [0] * len(self.buckets)
        self._works = []
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._ready(i, p))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _ready(self, i, p):
        b, slot = self._slot[i]
        if p.grad.data_ptr() != slot.data_ptr():   # a fresh .grad (after zero_grad): move it into the bucket
            slot.copy_(p.grad)
            p.grad = slot
        self._arrived[b] += 1
        if self._arrived[b] == len(self.buckets[b]):
            self._works.append((b, dist.all_reduce(self._buffers[b], async_op=True)))

    def finish_gradient_sync(self):
        for b, work in self._works:
            work.wait()
            self._buffers[b].div_(dist.get_world_size())
        self._works = []
        self._arrived = [0] * len(self.buckets)
