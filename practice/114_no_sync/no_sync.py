"""Problem 114: no_sync gradient accumulation.

Read README.md in this folder first.  ``AccumulatingDDP`` already works: it averages
every gradient over the ranks during backward.  Add ``no_sync()`` (and make the hook
respect it), then write ``train_step``.  Run ``python judge.py 114``.
"""
from __future__ import annotations

import contextlib

import torch.distributed as dist
from torch import nn


class AccumulatingDDP(nn.Module):
    """Data parallelism that averages each gradient over the ranks as soon as backward produces it.

    ``AccumulatingDDP(module)`` broadcasts rank 0's parameters so every rank starts equal,
    then registers a hook on every parameter that requires grad.  The hook runs once the
    parameter's ``.grad`` has been accumulated, and all-reduces it in place (an average).

    ``self.require_backward_grad_sync`` says whether backward passes should communicate;
    ``no_sync()`` turns it off for the backward passes inside it.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._average_grad)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _average_grad(self, p):
        """Runs during backward, once ``p.grad`` holds this backward's contribution added to what was there."""
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()

    @contextlib.contextmanager
    def no_sync(self):
        """Inside it, backward passes communicate nothing and only accumulate local gradients.

        The first backward after it averages the accumulated gradients.  On exit, even by
        an exception, the previous setting comes back, so ``no_sync()`` blocks may nest.
        """
        raise NotImplementedError("AccumulatingDDP.no_sync: see README.md, 'no_sync'")
        yield


def train_step(ddp: AccumulatingDDP, optimizer, micro_batches, loss_fn) -> float:
    """One optimizer step over k >= 1 micro-batches ``[(x, y), ...]`` of this rank.

    ``optimizer.zero_grad()``; then for each micro-batch, ``loss_fn(ddp(x), y) / k`` and its
    backward, all but the last one inside ``ddp.no_sync()``; then ``optimizer.step()``.
    Returns the mean of the k unscaled losses, as a Python float.
    """
    raise NotImplementedError("train_step: see README.md, 'train_step'")
