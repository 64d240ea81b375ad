"""DDP whose state lives in closures: one hook-maker per bucket keeps that bucket's counter and pending work.

The constructor broadcasts every trainable parameter in one flat tensor (frozen ones are left alone: the
statement leaves their broadcast free), each bucket's gradients are divided by the world size before the
all-reduce instead of after it, and finish_gradient_sync runs the closures' finishers in launch order.
make_buckets walks the sizes with a recursive helper.
"""
import torch
import torch.distributed as dist
from torch import nn


def make_buckets(sizes, cap):
    def walk(i, bucket, used):
        if i < 0:
            return [bucket] if bucket else []
        if bucket and used + sizes[i] > cap:
            return [bucket] + walk(i, [], 0)
        return walk(i - 1, bucket + [i], used + sizes[i])
    return walk(len(sizes) - 1, [], 0)


def comm_timeline(ready, buckets, sizes, bw, latency=0.0):
    spans, free = [], 0.0
    for bucket in buckets:
        start = max([free] + [ready[i] for i in bucket])
        free = start + latency + sum(sizes[i] for i in bucket) / bw
        spans.append((float(start), float(free)))
    return spans


def exposed_comm(ready, buckets, sizes, bw, latency=0.0):
    spans = comm_timeline(ready, buckets, sizes, bw, latency)
    return max(0.0, spans[-1][1] - max(ready)) if spans else 0.0


def _bucket_hooks(params, launched):
    """A hook for each of ``params`` (one bucket) and nothing else: the last ready one launches the bucket."""
    seen = set()

    def finish(flat, work):
        def run():
            work.wait()
            for p, piece in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(piece.view_as(p))
        return run

    def hook(p):
        seen.add(id(p))
        if len(seen) == len(params):
            seen.clear()
            flat = torch.cat([q.grad.flatten() for q in params]) / dist.get_world_size()
            launched.append(finish(flat, dist.all_reduce(flat, async_op=True)))
    return hook


class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_cap_bytes):
        super().__init__()
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        if self.params:
            flat = torch.cat([p.detach().flatten() for p in self.params])
            dist.broadcast(flat, src=0)
            with torch.no_grad():
                for p, piece in zip(self.params, flat.split([p.numel() for p in self.params])):
                    p.copy_(piece.view_as(p))
        self.buckets = make_buckets([p.numel() * p.element_size() for p in self.params], bucket_cap_bytes)
        self._launched = []
        for bucket in self.buckets:
            hook = _bucket_hooks([self.params[i] for i in bucket], self._launched)
            for i in bucket:
                self.params[i].register_post_accumulate_grad_hook(hook)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_sync(self):
        while self._launched:
            self._launched.pop(0)()
