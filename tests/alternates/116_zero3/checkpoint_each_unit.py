"""ZeRO-3 through activation checkpointing: each unit runs inside torch.utils.checkpoint (non-reentrant), and
an autograd Function turns the shard into the gathered flat vector.

The Function's forward all-gathers the shard, its backward reduce-scatters the flat gradient (divided by N), so
autograd itself adds each backward's shard gradient to .grad.  Inside the checkpointed region the unit's
attributes are views of the gathered vector, replaced by empty tensors once the unit has run; the checkpoint
keeps no saved tensor, so nothing else holds the gathered memory.  In backward the checkpoint re-runs the region:
that is the second all-gather, and the views it saves live only until the unit's backward has used them.
The checkpoint keeps the CPU random-number state of each region (preserve_rng_state), a uint8 tensor.
"""
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, world, group):
        ctx.world, ctx.group = world, group
        full = shard.new_empty(world * shard.numel())
        dist.all_gather_into_tensor(full, shard.detach(), group=group)
        return full

    @staticmethod
    def backward(ctx, grad_full):
        grad = grad_full.new_empty(grad_full.numel() // ctx.world)
        dist.reduce_scatter_tensor(grad, grad_full.contiguous(), group=ctx.group)
        return grad / ctx.world, None, None


class _ShardedUnit:
    def __init__(self, child, shard, world, group):
        self.child, self.shard, self.world, self.group = child, shard, world, group
        self.layout = [(name, p.shape) for name, p in child.named_parameters()]
        self.sizes = [math.prod(shape) for _, shape in self.layout]
        for name, _ in self.layout:
            child._parameters.pop(name)
        self._empty()

    def _empty(self):
        for name, _ in self.layout:
            setattr(self.child, name, self.shard.new_empty(0).detach())

    def _pieces(self, full):
        """The parameters' pieces of the gathered vector, padding left out."""
        return full[:sum(self.sizes)].split(self.sizes)

    def _run(self, x, shard):
        full = _Gather.apply(shard, self.world, self.group)
        for (name, shape), piece in zip(self.layout, self._pieces(full)):
            setattr(self.child, name, piece.view(shape))
        try:
            return self.child(x)
        finally:
            self._empty()

    def __call__(self, x):
        return checkpoint(self._run, x, self.shard, use_reentrant=False)

    @torch.no_grad()
    def full_tensors(self):
        full = _Gather.apply(self.shard, self.world, self.group)
        return {name: piece.view(shape).clone() for (name, shape), piece in zip(self.layout, self._pieces(full))}


class FullyShardedModel(nn.Module):
    def __init__(self, module, group=None):
        super().__init__()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self._keys = list(module.state_dict())
        self.shards = nn.ParameterList()
        self._steps = []
        for index, child in enumerate(module):
            flat = [p.detach().reshape(-1) for p in child.parameters()]
            if not flat:
                self._steps.append((index, child))
                continue
            numel = sum(t.numel() for t in flat)
            s = math.ceil(numel / world)
            padded = torch.cat(flat + [flat[0].new_zeros(world * s - numel)])
            self.shards.append(nn.Parameter(padded[rank * s:(rank + 1) * s].clone()))
            self._steps.append((index, _ShardedUnit(child, self.shards[-1], world, group)))
        self._children = list(module)   # not a registered submodule: parameters() are the shards only

    def forward(self, x):
        for _, step in self._steps:
            x = step(x)
        return x

    def full_state_dict(self):
        values = {}
        for index, step in self._steps:
            if isinstance(step, _ShardedUnit):
                values.update({f"{index}.{name}": t for name, t in step.full_tensors().items()})
        return {key: values[key] for key in self._keys}
