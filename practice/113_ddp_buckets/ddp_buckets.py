"""Problem 113: DDP gradient buckets and the communication timeline (DDP 的梯度分桶与通信时间线).

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 113``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def make_buckets(sizes: list[int], cap: int) -> list[list[int]]:
    """Group parameters into gradient buckets of at most ``cap`` bytes.

    ``sizes[i]`` is parameter i's gradient bytes, in definition order.  Walk from
    the LAST parameter to the first; close the current bucket when it is non-empty
    and adding the next parameter would exceed ``cap``.  A parameter larger than
    ``cap`` gets a bucket of its own.  Each bucket lists indices in the order added.

    >>> make_buckets([4, 4, 4, 4], 8)
    [[3, 2], [1, 0]]
    """
    raise NotImplementedError("make_buckets: see README.md, 'make_buckets'")


def comm_timeline(ready, buckets, sizes, bw, latency=0.0) -> list[tuple[float, float]]:
    """(start, end) of each bucket's all-reduce on one communication stream.

    A bucket starts at max(all its parameters ready, previous bucket's end) and
    lasts ``latency + bucket_bytes / bw``.  Buckets run in list order.
    """
    raise NotImplementedError("comm_timeline: see README.md, 'The communication timeline'")


def exposed_comm(ready, buckets, sizes, bw, latency=0.0) -> float:
    """Communication left after the last gradient is ready: max(0, last end - max(ready))."""
    raise NotImplementedError("exposed_comm: see README.md, 'The communication timeline'")


class BucketedDDP(nn.Module):
    """Data parallelism with bucketed, overlapped gradient all-reduce.

    ``BucketedDDP(module, bucket_cap_bytes)``:
      * broadcasts rank 0's parameters, so every rank starts equal;
      * ``self.params``: the module's parameters that require grad, in order;
      * ``self.buckets = make_buckets(<their gradient bytes>, bucket_cap_bytes)``;
      * registers ``register_post_accumulate_grad_hook`` on each parameter; when all
        of a bucket's gradients are ready, launches ONE ``all_reduce(async_op=True)``
        of the bucket flattened into one tensor.
    ``finish_gradient_sync()`` waits for them all and writes the average into every .grad.
    A second backward without zero_grad adds to .grad; its buckets carry that accumulated .grad.
    """

    def __init__(self, module: nn.Module, bucket_cap_bytes: int):
        super().__init__()
        self.module = module
        raise NotImplementedError("BucketedDDP.__init__: see README.md, 'BucketedDDP'")

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_sync(self):
        """Wait for every bucket's all-reduce and write the averaged gradients into .grad."""
        raise NotImplementedError("BucketedDDP.finish_gradient_sync: see README.md, 'BucketedDDP'")
