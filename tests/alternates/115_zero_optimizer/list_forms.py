"""A correct ZeRO-1/2 in the list forms: one all_reduce per parameter at stage 1, then
``dist.reduce_scatter(out, list)`` and ``dist.all_gather(list, t)``.  gloo runs several ops inside the
list-form reduce_scatter; the tamper check must still count it as the one collective it is."""
import os

import torch
import torch.distributed as dist

import harness

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_reference = harness.Target(os.path.join(_ROOT, "solutions", "115_zero_optimizer", "zero.py")).load()


class ShardedOptimizer(_reference.ShardedOptimizer):
    def _reduce_gradients(self):
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.params]
        if self.stage == 1:
            for g in grads:
                dist.all_reduce(g, group=self.group)
            return self._flatten(grads)[self._own] / self.world
        grad = torch.empty(self.shard_size, dtype=self.dtype, device=self.shard.device)
        dist.reduce_scatter(grad, list(self._flatten(grads).chunk(self.world)), group=self.group)
        return grad / self.world

    def _gather_parameters(self):
        pieces = [torch.empty(self.shard_size, dtype=self.dtype, device=self.shard.device) for _ in range(self.world)]
        dist.all_gather(pieces, self.shard.detach().to(self.dtype), group=self.group)
        full = torch.cat(pieces)
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
