"""Every plan tried (branch and bound over the cuts, the chains are short), a reentrant recompute that keeps the
segment's input and RNG state as plain attributes of its node, and one async all_reduce per gradient, all in
flight together."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def sqrt_segments(num_units):
    k = math.ceil(math.sqrt(num_units))
    while (k - 1) * (k - 1) >= num_units:   # float sqrt may land just above an integer
        k -= 1
    while k * k < num_units:
        k += 1
    return [(i, min(num_units, i + k), True) for i in range(0, num_units, k)]


def plan_checkpoints(unit_bytes, input_bytes, unit_flops, budget):
    n, found = len(unit_bytes), [math.inf, None]

    def search(i, held, flops, plan):
        if flops >= found[0] or held > budget:
            return
        if i == n:
            found[:] = [flops, list(plan)]
            return
        for j in range(n, i, -1):             # long recomputed segments first: a good bound early
            if held + sum(unit_bytes[i:j]) <= budget:
                search(j, held + input_bytes[i], flops + sum(unit_flops[i:j]), plan + [(i, j, True)])
        search(i + 1, held + unit_bytes[i], flops, plan + [(i, i + 1, False)])

    search(0, 0, 0, [])
    if found[1] is None:
        raise ValueError("no plan fits the budget")
    return found[1]


class _Segment(torch.autograd.Function):
    @staticmethod
    def forward(ctx, units, x, *params):
        ctx.units, ctx.x, ctx.x_needs = units, x.detach(), x.requires_grad
        ctx.rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if x.device.type == "cuda" else None
        ctx.n = len(params)
        for unit in units:
            x = unit(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        x = ctx.x.requires_grad_(ctx.x_needs)
        state = torch.get_rng_state()
        cuda_state = torch.cuda.get_rng_state(x.device) if ctx.cuda_rng is not None else None
        torch.set_rng_state(ctx.rng)
        if ctx.cuda_rng is not None:
            torch.cuda.set_rng_state(ctx.cuda_rng, x.device)
        try:
            with torch.enable_grad():
                out = x
                for unit in ctx.units:
                    out = unit(out)
            out.backward(grad)
        finally:
            torch.set_rng_state(state)
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, x.device)
        return (None, x.grad if ctx.x_needs else None) + (None,) * ctx.n


def train_step(units, plan, x, y, loss_fn, group=None):
    for start, stop, recompute in plan:
        segment = units[start:stop]
        if recompute:
            x = _Segment.apply(segment, x, *[p for u in segment for p in u.parameters()])
        else:
            for unit in segment:
                x = unit(x)
    loss = loss_fn(x, y)
    loss.backward()
    params = [p for u in units for p in u.parameters() if p.grad is not None]
    works = [dist.all_reduce(p.grad, group=group, async_op=True) for p in params]
    for work in works:
        work.wait()
    size = dist.get_world_size(group)
    for p in params:
        p.grad.div_(size)
    return loss.item()
