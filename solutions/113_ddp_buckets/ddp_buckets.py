"""Problem 113 reference: DDP gradient buckets and the communication timeline."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def make_buckets(sizes: list[int], cap: int) -> list[list[int]]:
    buckets, current, used = [], [], 0
    for i in reversed(range(len(sizes))):
        if current and used + sizes[i] > cap:
            buckets.append(current)
            current, used = [], 0
        current.append(i)
        used += sizes[i]
    if current:
        buckets.append(current)
    return buckets


def comm_timeline(ready, buckets, sizes, bw, latency=0.0) -> list[tuple[float, float]]:
    spans, stream_free = [], 0.0
    for bucket in buckets:
        start = max(max(ready[i] for i in bucket), stream_free)
        end = start + latency + sum(sizes[i] for i in bucket) / bw
        spans.append((start, end))
        stream_free = end
    return spans


def exposed_comm(ready, buckets, sizes, bw, latency=0.0) -> float:
    spans = comm_timeline(ready, buckets, sizes, bw, latency)
    if not spans:
        return 0.0
    return max(0.0, spans[-1][1] - max(ready))


class BucketedDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = make_buckets([p.numel() * p.element_size() for p in self.params], bucket_cap_bytes)
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}
        self._pending = []
        self._ready = [0] * len(self.buckets)
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self._grad_ready(i))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, i: int):
        b = self._bucket_of[i]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            flat = torch.cat([self.params[j].grad.flatten() for j in self.buckets[b]])
            self._pending.append((b, flat, dist.all_reduce(flat, async_op=True)))

    def finish_gradient_sync(self):
        world = dist.get_world_size()
        for b, flat, work in self._pending:
            work.wait()
            flat /= world
            offset = 0
            for j in self.buckets[b]:
                g = self.params[j].grad
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        self._pending.clear()
        self._ready = [0] * len(self.buckets)
