"""Reference for problem 131: memory-optimal activation checkpointing, under data parallelism.

A plan cuts the chain of units into segments ``(start, stop, recompute)``.  A kept segment runs with
autograd as usual; a recomputed one runs without autograd, keeps only its input, and in backward runs
again -- with the RNG state it had the first time -- before its own backward.  The planner is a dynamic
programme over "how many bytes the units before i hold"; the step averages the gradients over the group.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


# ---- plans ---------------------------------------------------------------------------------------------

def sqrt_segments(num_units: int) -> list[tuple[int, int, bool]]:
    """Chen et al.'s scheme: segments of ceil(sqrt(L)) units (the last one shorter), every one recomputed."""
    k = math.isqrt(num_units - 1) + 1          # ceil(sqrt(L)) for L >= 1
    return [(start, min(start + k, num_units), True) for start in range(0, num_units, k)]


def plan_checkpoints(unit_bytes: list[int], input_bytes: list[int], unit_flops: list[int],
                     budget: int) -> list[tuple[int, int, bool]]:
    """The plan of least recompute FLOPs whose peak of saved bytes is at most ``budget``; ValueError if none.

    held = bytes kept, up to unit i, for backward: s[u] per kept unit, a[start] per recomputed segment.
    A recomputed segment [i, j) peaks, in backward, at held(i) + s[i] + ... + s[j-1]; the forward ends at
    held(L).  best[i] maps each reachable held(i) to the cheapest (flops, plan) reaching it.
    """
    n = len(unit_bytes)
    best = [dict() for _ in range(n + 1)]
    best[0][0] = (0, [])
    for i in range(n):
        for held, (flops, plan) in _pareto(best[i]):
            if held + unit_bytes[i] <= budget:                                               # keep unit i
                _offer(best[i + 1], held + unit_bytes[i], flops, plan + [(i, i + 1, False)])
            transient, extra = held, 0
            for j in range(i + 1, n + 1):                                                    # recompute [i, j)
                transient += unit_bytes[j - 1]
                extra += unit_flops[j - 1]
                if transient > budget:
                    break
                _offer(best[j], held + input_bytes[i], flops + extra, plan + [(i, j, True)])
    fits = list(best[n].values())   # every entry holds at most the budget: nothing larger was offered
    if not fits:
        raise ValueError(f"no plan keeps the saved bytes within {budget}: even the leanest plan needs more")
    return _merge_kept(min(fits)[1])


def _offer(table, held, flops, plan):
    if held not in table or flops < table[held][0]:
        table[held] = (flops, plan)


def _pareto(table):
    """The entries no other beats on both held bytes and FLOPs (the others can only lead to worse plans)."""
    kept, least = [], math.inf
    for held, (flops, plan) in sorted(table.items()):
        if flops < least:
            kept.append((held, (flops, plan)))
            least = flops
    return kept


def _merge_kept(plan):
    merged = []
    for start, stop, recompute in plan:
        if merged and not recompute and not merged[-1][2]:
            merged[-1] = (merged[-1][0], stop, False)
        else:
            merged.append((start, stop, recompute))
    return merged


# ---- recompute -----------------------------------------------------------------------------------------

def _rng_state(device):
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(device, state):
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class _Recompute(torch.autograd.Function):
    """run(x) without autograd; in backward, run(x) again from the same RNG state, then its backward.

    The segment's parameters are inputs too: when x needs no gradient (the batch), the output still needs one,
    so backward reaches this node.  Their gradients accumulate straight into .grad, in the inner backward
    (``torch.autograd.backward``: torch's FLOP counter cannot follow ``torch.autograd.grad`` into a module
    called on a leaf)."""

    @staticmethod
    def forward(ctx, run, x, *params):
        ctx.run, ctx.n_params = run, len(params)
        ctx.rng = _rng_state(x.device)         # an attribute: only the input is saved for backward
        ctx.save_for_backward(x)
        return run(x)                          # autograd is off inside forward: nothing of run is saved

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(ctx.needs_input_grad[1])
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.enable_grad():   # the caller's RNG comes back after
            _set_rng_state(x.device, ctx.rng)
            out = ctx.run(x)
        torch.autograd.backward(out, grad_out)   # the parameters' .grad accumulate here, x.grad is the input's
        return (None, x.grad) + (None,) * ctx.n_params


def _chain(units):
    def run(x):
        for unit in units:
            x = unit(x)
        return x
    return run


def _checkpointed(units, plan, x):
    """The chain's output; each recomputed segment keeps only its input for backward."""
    for start, stop, recompute in plan:
        segment = units[start:stop]
        if recompute:
            params = [p for unit in segment for p in unit.parameters() if p.requires_grad]
            x = _Recompute.apply(_chain(segment), x, *params)
        else:
            x = _chain(segment)(x)
    return x


# ---- one data-parallel step ---------------------------------------------------------------------------

def train_step(units, plan, x, y, loss_fn, group=None) -> float:
    """Forward by the plan, loss, backward (recomputing), then every gradient averaged over ``group``."""
    loss = loss_fn(_checkpointed(units, plan, x), y)
    loss.backward()
    _average_gradients(units, group)
    return loss.item()


def _average_gradients(units, group):
    world = dist.get_world_size(group)
    for unit in units:
        for p in unit.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)       # SUM over the group's ranks ...
                p.grad.div_(world)                          # ... then the mean
