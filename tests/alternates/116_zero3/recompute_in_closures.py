"""A correct but unusual ZeRO-3: the recompute design, every unit's state held in closures, and all of this
rank's shards views into one flat buffer.  A torch.autograd.Function per unit gathers, runs the unit under
no_grad and frees in its forward; its backward gathers again, re-runs the unit with grad, reduce-scatters, frees,
and returns the shard's gradient, which autograd adds to .grad itself (so backward passes accumulate)."""
import math
import types

import torch
import torch.distributed as dist
from torch import nn


def _unit_closures(child, shard, world, group):
    """gather() / free() / recompute() for one unit; the gathered buffer lives only in this closure."""
    named = list(child.named_parameters())
    names, shapes = [n for n, _ in named], [p.shape for _, p in named]
    for name in names:
        owner, _, attr = name.rpartition(".")
        module = child.get_submodule(owner) if owner else child
        module._parameters.pop(attr)
        setattr(module, attr, torch.empty(0, dtype=shard.dtype))
    gathered = torch.empty(0, dtype=shard.dtype)

    def point_attributes_at(flat):
        offset = 0
        for name, shape in zip(names, shapes):
            owner, _, attr = name.rpartition(".")
            module = child.get_submodule(owner) if owner else child
            setattr(module, attr, flat[offset:offset + math.prod(shape)].view(shape))
            offset += math.prod(shape)

    def gather():
        nonlocal gathered
        gathered = torch.empty(world * shard.numel(), dtype=shard.dtype)
        dist.all_gather_into_tensor(gathered, shard.detach(), group=group)
        return gathered

    def free():
        gathered.untyped_storage().resize_(0)
        for name in names:
            owner, _, attr = name.rpartition(".")
            setattr(child.get_submodule(owner) if owner else child, attr, torch.empty(0, dtype=shard.dtype))

    def run(x):
        point_attributes_at(gather())
        try:
            return child(x)
        finally:
            free()

    def recompute(x, grad_out):
        flat = gather().requires_grad_(True)
        try:
            with torch.enable_grad():   # backward runs without grad mode: the views must be taken with it
                point_attributes_at(flat)
                x = x.detach().requires_grad_(x.requires_grad)
                out = child(x)
                wrt = [flat, x] if x.requires_grad else [flat]
                grads = torch.autograd.grad(out, wrt, grad_out)
            grad_shard = torch.empty_like(shard)
            dist.reduce_scatter_tensor(grad_shard, grads[0].contiguous(), group=group)
            return (grads[1] if x.requires_grad else None), grad_shard / world
        finally:
            free()

    def full_values():
        flat = torch.empty(world * shard.numel(), dtype=shard.dtype)
        dist.all_gather_into_tensor(flat, shard.detach(), group=group)
        out, offset = {}, 0
        for name, shape in zip(names, shapes):
            out[name] = flat[offset:offset + math.prod(shape)].view(shape).clone()
            offset += math.prod(shape)
        return out

    return types.SimpleNamespace(run=run, recompute=recompute, full_values=full_values)


class _Unit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, closures):
        ctx.closures = closures
        ctx.save_for_backward(x)
        return closures.run(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        grad_x, grad_shard = ctx.closures.recompute(x, grad_out)
        return grad_x, grad_shard, None


class FullyShardedModel(nn.Module):
    def __init__(self, module, group=None):
        super().__init__()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        keys = list(module.state_dict())
        sizes, flats = [], []
        for child in module:
            params = [p.detach().reshape(-1) for p in child.parameters()]
            if params:
                s = math.ceil(sum(p.numel() for p in params) / world)
                flat = torch.cat(params + [params[0].new_zeros(world * s - sum(p.numel() for p in params))])
                flats.append(flat[rank * s:(rank + 1) * s])
                sizes.append(s)
        # one buffer for every shard this rank owns; each unit's nn.Parameter is a view into it
        storage = torch.cat(flats) if flats else torch.zeros(0)
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.shards = nn.ParameterList(nn.Parameter(storage[o:o + s]) for o, s in zip(offsets, sizes))
        steps, shards = [], iter(self.shards)
        for index, child in enumerate(module):
            if any(True for _ in child.parameters()):
                shard = next(shards)
                steps.append((index, shard, _unit_closures(child, shard, world, group), child))
            else:
                steps.append((index, None, None, child))

        def forward(x):
            for _, shard, closures, child in steps:
                x = child(x) if shard is None else _Unit.apply(x, shard, closures)
            return x

        @torch.no_grad()
        def full_state_dict():
            values = {}
            for index, shard, closures, _ in steps:
                if shard is not None:
                    values.update({f"{index}.{name}": t for name, t in closures.full_values().items()})
            return {key: values[key] for key in keys}

        self._forward, self.full_state_dict = forward, full_state_dict

    def forward(self, x):
        return self._forward(x)
