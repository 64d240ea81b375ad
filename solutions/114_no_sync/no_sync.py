"""Problem 114 reference: no_sync gradient accumulation."""
from __future__ import annotations

import contextlib

import torch.distributed as dist
from torch import nn


class AccumulatingDDP(nn.Module):
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
        if not self.require_backward_grad_sync:
            return
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()

    @contextlib.contextmanager
    def no_sync(self):
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous


def train_step(ddp: AccumulatingDDP, optimizer, micro_batches, loss_fn) -> float:
    k = len(micro_batches)
    if k < 1:
        raise ValueError("train_step needs at least one micro-batch")
    optimizer.zero_grad()
    losses = [_backward(ddp, x, y, loss_fn, k, sync=i == k - 1) for i, (x, y) in enumerate(micro_batches)]
    optimizer.step()
    return sum(losses) / k


def _backward(ddp, x, y, loss_fn, k, sync: bool) -> float:
    """Forward and backward of one micro-batch, its loss scaled by 1/k, inside no_sync() unless ``sync``."""
    with contextlib.nullcontext() if sync else ddp.no_sync():
        loss = loss_fn(ddp(x), y)
        (loss / k).backward()
    return loss.item()
