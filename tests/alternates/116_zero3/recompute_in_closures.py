"""A correct but unusual ZeRO-3: the recompute design, every unit's state held in closures, and all of this
rank's shards views into one flat buffer.  A torch.autograd.Function per unit gathers, runs the unit under
no_grad and frees in its forward; its backward gathers again, re-runs the unit with grad, reduce-scatters, frees,
and returns the shard's gradient, which autograd adds to .grad itself (so backward passes accumulate).

Prefetch: each unit's closures are linked to the closures of the unit the forward reaches next and of the one
the backward reaches next; a unit's run (forward) or recompute (backward) takes its own gathered vector, waiting
for the gather the unit before it issued, then issues the linked unit's all_gather and only then computes.
With compute_dtype the gathers carry the shard cast to it, and the recompute's gradient is cast back to the
shard's dtype before the reduce_scatter."""
import math
import types

import torch
import torch.distributed as dist
from torch import nn


def _unit_closures(child, shard, world, group, dtype):
    """launch() / take() / run() / recompute() for one unit; its gathered buffers live only in this closure."""
    named = list(child.named_parameters())
    names, shapes = [n for n, _ in named], [p.shape for _, p in named]
    for name in names:
        owner, _, attr = name.rpartition(".")
        module = child.get_submodule(owner) if owner else child
        module._parameters.pop(attr)
        setattr(module, attr, torch.empty(0, dtype=dtype, device=shard.device))
    gathered = torch.empty(0, dtype=dtype, device=shard.device)
    in_flight = None   # (work, buffer, source) of the all_gather a neighbour issued for this unit
    links = types.SimpleNamespace(forward=None, backward=None)   # the next unit's closures, per direction

    def point_attributes_at(flat):
        offset = 0
        for name, shape in zip(names, shapes):
            owner, _, attr = name.rpartition(".")
            module = child.get_submodule(owner) if owner else child
            setattr(module, attr, flat[offset:offset + math.prod(shape)].view(shape))
            offset += math.prod(shape)

    def launch():
        nonlocal in_flight
        buffer = torch.empty(world * shard.numel(), dtype=dtype, device=shard.device)
        source = shard.detach().to(dtype)
        in_flight = (dist.all_gather_into_tensor(buffer, source, group=group, async_op=True), buffer, source)

    def take(direction):
        """This unit's gathered vector; then the next unit's gather goes out, before this unit computes."""
        nonlocal gathered, in_flight
        if in_flight is None:
            launch()
        work, gathered, _ = in_flight
        in_flight = None
        work.wait()
        ahead = getattr(links, direction)
        if ahead is not None:
            ahead.launch()
        return gathered

    def free():
        gathered.untyped_storage().resize_(0)
        for name in names:
            owner, _, attr = name.rpartition(".")
            setattr(child.get_submodule(owner) if owner else child, attr,
                    torch.empty(0, dtype=dtype, device=shard.device))

    def run(x):
        point_attributes_at(take("forward"))
        try:
            return child(x)
        finally:
            free()

    def recompute(x, grad_out):
        flat = take("backward").requires_grad_(True)
        try:
            with torch.enable_grad():   # backward runs without grad mode: the views must be taken with it
                point_attributes_at(flat)
                x = x.detach().requires_grad_(x.requires_grad)
                out = child(x)
                wrt = [flat, x] if x.requires_grad else [flat]
                grads = torch.autograd.grad(out, wrt, grad_out)
            grad_shard = torch.empty_like(shard)
            dist.reduce_scatter_tensor(grad_shard, grads[0].to(shard.dtype).contiguous(), group=group)
            return (grads[1] if x.requires_grad else None), grad_shard / world
        finally:
            free()

    def full_values():
        flat = torch.empty(world * shard.numel(), dtype=shard.dtype, device=shard.device)
        dist.all_gather_into_tensor(flat, shard.detach(), group=group)
        out, offset = {}, 0
        for name, shape in zip(names, shapes):
            out[name] = flat[offset:offset + math.prod(shape)].view(shape).clone()
            offset += math.prod(shape)
        return out

    return types.SimpleNamespace(run=run, recompute=recompute, full_values=full_values, launch=launch, links=links)


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
    def __init__(self, module, group=None, compute_dtype=None):
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
                closures = _unit_closures(child, shard, world, group, compute_dtype or shard.dtype)
                steps.append((index, shard, closures, child))
            else:
                steps.append((index, None, None, child))
        chain = [closures for _, _, closures, _ in steps if closures is not None]
        for before, after in zip(chain, chain[1:]):
            before.links.forward, after.links.backward = after, before

        def forward(x):
            if compute_dtype is not None and x.is_floating_point():
                x = x.to(compute_dtype)
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
