"""no_sync as a nesting depth: the hook syncs only when no no_sync() block is open.

require_backward_grad_sync becomes a read-only property (depth == 0), so restoring the previous setting is
the decrement in a finally.  The hook divides before the all-reduce.  train_step scales the backward with
loss.backward(gradient=1/k) instead of dividing the loss, keeps the losses as a detached tensor sum, and
opens all but the last micro-batch's no_sync() through one contextlib.ExitStack per micro-batch.
"""
import contextlib

import torch
import torch.distributed as dist
from torch import nn


class AccumulatingDDP(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self._depth = 0
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._average_grad)

    @property
    def require_backward_grad_sync(self):
        return self._depth == 0

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _average_grad(self, p):
        if self.require_backward_grad_sync:
            p.grad /= dist.get_world_size()
            dist.all_reduce(p.grad)

    @contextlib.contextmanager
    def no_sync(self):
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1


def train_step(ddp, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    total = None
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.ExitStack() as stack:
            if i + 1 < k:
                stack.enter_context(ddp.no_sync())
            loss = loss_fn(ddp(x), y)
            loss.backward(gradient=torch.full_like(loss, 1.0 / k))
        total = loss.detach() if total is None else total + loss.detach()
    optimizer.step()
    return (total / k).item()
