"""A DDP that averages all gradients in one flat all-reduce, with no_sync as a class-based context manager.

The hooks count ready gradients; when the last trainable parameter's gradient is ready, one all-reduce of
every gradient concatenated runs, and its average is written back.  no_sync() returns an object whose
__enter__ pushes the old setting on a stack and whose __exit__ pops it (never swallowing the exception).
train_step runs each forward outside no_sync() and only the backward passes inside it.
"""
import torch
import torch.distributed as dist
from torch import nn


class _NoSync:
    def __init__(self, ddp):
        self.ddp = ddp

    def __enter__(self):
        self.ddp._saved.append(self.ddp.require_backward_grad_sync)
        self.ddp.require_backward_grad_sync = False
        return self

    def __exit__(self, *exc):
        self.ddp.require_backward_grad_sync = self.ddp._saved.pop()
        return False


class AccumulatingDDP(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True
        self._saved = []
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p, src=0)
        self._trainable = [p for p in module.parameters() if p.requires_grad]
        self._ready = 0
        for p in self._trainable:
            p.register_post_accumulate_grad_hook(self._gradient_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _gradient_ready(self, p):
        """Counts the gradients of a synchronised backward; the last one of them syncs them all."""
        self._ready += self.require_backward_grad_sync
        if self._ready == len(self._trainable):
            self._ready = 0
            self._average_all()

    def _average_all(self):
        flat = torch.cat([q.grad.flatten() for q in self._trainable])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for q, piece in zip(self._trainable, flat.split([q.numel() for q in self._trainable])):
            q.grad.copy_(piece.view_as(q))

    def no_sync(self):
        return _NoSync(self)


def train_step(ddp, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    losses = []
    for i, (x, y) in enumerate(micro_batches):
        loss = loss_fn(ddp(x), y)
        losses.append(loss.item())
        if i < k - 1:
            with ddp.no_sync():
                (loss / k).backward()
        else:
            (loss / k).backward()
    optimizer.step()
    return float(sum(losses) / k)
