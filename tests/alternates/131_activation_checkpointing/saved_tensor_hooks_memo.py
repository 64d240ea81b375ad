"""Checkpointing without a custom autograd.Function, as torch's non-reentrant checkpoint does it: a recomputed
segment runs with autograd, under saved-tensor hooks that keep an index instead of each tensor; the first unpack
in backward recomputes the segment (RNG state restored, inside fork_rng) and captures its saved tensors in the
same order.  The planner is a memoised recursion from the left, the gradients one flat all_reduce."""
from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist


def sqrt_segments(num_units):
    k = 1
    while k * k < num_units:
        k += 1
    bounds = list(range(0, num_units, k)) + [num_units]
    return [(lo, hi, True) for lo, hi in zip(bounds, bounds[1:])]


def plan_checkpoints(unit_bytes, input_bytes, unit_flops, budget):
    n = len(unit_bytes)

    @functools.lru_cache(maxsize=None)
    def best(i, held):
        """(least recompute FLOPs, plan) for units i.. given ``held`` bytes kept before i; (inf, None) if none."""
        if i == n:
            return (0, ()) if held <= budget else (math.inf, None)
        options = [(best(i + 1, held + unit_bytes[i])[0], (i, i + 1, False), held + unit_bytes[i], i + 1)]
        for j in range(i + 1, n + 1):
            if held + sum(unit_bytes[i:j]) <= budget:
                rest = best(j, held + input_bytes[i])
                options.append((rest[0] + sum(unit_flops[i:j]), (i, j, True), held + input_bytes[i], j))
        flops, seg, nxt_held, nxt = min(options, key=lambda o: o[0])
        if math.isinf(flops):
            return math.inf, None
        return flops, (seg,) + best(nxt, nxt_held)[1]

    flops, plan = best(0, 0)
    if plan is None:
        raise ValueError(f"budget {budget} is below every plan's peak")
    return list(plan)


class _Replay:
    """One recomputed segment: what its forward saved is replaced by indices, refilled on demand."""

    def __init__(self, units, x):
        self.units, self.x = units, x.detach()
        self.needs_grad = x.requires_grad
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state(x.device) if x.device.type == "cuda" else None
        self.count, self.saved = 0, None

    def pack(self, tensor):
        self.count += 1
        return self.count - 1

    def unpack(self, index):
        if self.saved is None:
            self.saved = []
            x = self.x.detach().requires_grad_(self.needs_grad)
            with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
                torch.set_rng_state(self.rng)
                if self.cuda_rng is not None:
                    torch.cuda.set_rng_state(self.cuda_rng, x.device)
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(self._capture, lambda t: t):
                    for unit in self.units:
                        x = unit(x)
        return self.saved[index]

    def _capture(self, tensor):
        self.saved.append(tensor.detach())
        return tensor

    def run(self, x):
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            for unit in self.units:
                x = unit(x)
        return x


def train_step(units, plan, x, y, loss_fn, group=None):
    h = x
    for start, stop, recompute in plan:
        if recompute:
            h = _Replay(units[start:stop], h).run(h)
        else:
            for unit in units[start:stop]:
                h = unit(h)
    loss = loss_fn(h, y)
    loss.backward()
    grads = [p.grad for unit in units for p in unit.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return float(loss.detach())
