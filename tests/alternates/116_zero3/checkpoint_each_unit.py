"""ZeRO-3 through activation checkpointing: each unit runs inside torch.utils.checkpoint (non-reentrant), and
an autograd Function turns the shard into the gathered flat vector.

The Function's forward takes the gathered vector (prefetched, or gathered now), its backward reduce-scatters the
flat gradient (cast to the shard's dtype, divided by N), so autograd itself adds each backward's shard gradient to
.grad.  Inside the checkpointed region the unit's attributes are views of the gathered vector, replaced by empty
tensors once the unit has run; the checkpoint keeps no saved tensor, so nothing else holds the gathered memory.
In backward the checkpoint re-runs the region: that is the second all-gather, and the views it saves live only
until the unit's backward has used them.  The checkpoint keeps the CPU random-number state of each region
(preserve_rng_state), a uint8 tensor.

Prefetch: one schedule object for the whole model knows which way the pass runs (a hook on the model's output
turns it to backward when the output's gradient arrives), so the same region, run in forward or re-run by the
checkpoint in backward, issues the all_gather of the unit the pass reaches next before its unit computes.
"""
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint


class _Schedule:
    """The pass's direction and the all_gathers in flight, by unit."""

    def __init__(self):
        self.direction = "forward"
        self.in_flight = {}

    def backward_begins(self, grad):
        self.direction = "backward"


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        full = unit.take()
        ahead = unit.next if unit.schedule.direction == "forward" else unit.prev
        if ahead is not None:
            ahead.launch()   # travels while this unit computes
        return full

    @staticmethod
    def backward(ctx, grad_full):
        unit = ctx.unit
        grad = grad_full.new_empty(grad_full.numel() // unit.world, dtype=unit.shard.dtype)
        dist.reduce_scatter_tensor(grad, grad_full.to(unit.shard.dtype).contiguous(), group=unit.group)
        return grad / unit.world, None


class _ShardedUnit:
    def __init__(self, child, shard, world, group, dtype, schedule):
        self.child, self.shard, self.world, self.group = child, shard, world, group
        self.dtype, self.schedule = dtype, schedule
        self.prev = self.next = None
        self.layout = [(name, p.shape) for name, p in child.named_parameters()]
        self.sizes = [math.prod(shape) for _, shape in self.layout]
        for name, _ in self.layout:
            child._parameters.pop(name)
        self._empty()

    def launch(self):
        full = self.shard.new_empty(self.world * self.shard.numel(), dtype=self.dtype)
        source = self.shard.detach().to(self.dtype)
        work = dist.all_gather_into_tensor(full, source, group=self.group, async_op=True)
        self.schedule.in_flight[id(self)] = (work, full, source)

    def take(self):
        if id(self) not in self.schedule.in_flight:
            self.launch()
        work, full, _ = self.schedule.in_flight.pop(id(self))
        work.wait()
        return full

    def _empty(self):
        for name, _ in self.layout:
            setattr(self.child, name, self.shard.new_empty(0, dtype=self.dtype).detach())

    def _pieces(self, full):
        """The parameters' pieces of the gathered vector, padding left out."""
        return full[:sum(self.sizes)].split(self.sizes)

    def _run(self, x, shard):
        full = _Gather.apply(shard, self)
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
        full = self.shard.new_empty(self.world * self.shard.numel())
        dist.all_gather_into_tensor(full, self.shard.detach(), group=self.group)
        return {name: piece.view(shape).clone() for (name, shape), piece in zip(self.layout, self._pieces(full))}


class FullyShardedModel(nn.Module):
    def __init__(self, module, group=None, compute_dtype=None):
        super().__init__()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self._keys = list(module.state_dict())
        self._schedule = _Schedule()
        self._compute_dtype = compute_dtype
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
            dtype = compute_dtype or padded.dtype
            self._steps.append((index, _ShardedUnit(child, self.shards[-1], world, group, dtype, self._schedule)))
        sharded = [step for _, step in self._steps if isinstance(step, _ShardedUnit)]
        for before, after in zip(sharded, sharded[1:]):
            before.next, after.prev = after, before
        self._children = list(module)   # not a registered submodule: parameters() are the shards only

    def forward(self, x):
        self._schedule.direction = "forward"
        if self._compute_dtype is not None and x.is_floating_point():
            x = x.to(self._compute_dtype)
        for _, step in self._steps:
            x = step(x)
        if x.requires_grad:
            x.register_hook(self._schedule.backward_begins)
        return x

    def full_state_dict(self):
        values = {}
        for index, step in self._steps:
            if isinstance(step, _ShardedUnit):
                values.update({f"{index}.{name}": t for name, t in step.full_tensors().items()})
        return {key: values[key] for key in self._keys}
