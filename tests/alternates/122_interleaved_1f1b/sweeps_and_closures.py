"""A correct interleaved 1F1B built unlike the reference at every step.

* interleaved_schedule writes each rank's list op by op from the statement's closed formulas
  (g, q = divmod(k, p*v)), with no shared lists of forwards and backwards;
* simulate sweeps the ranks again and again (the hint's method), running each rank's next ops while what they
  need has ended, instead of ordering every op first;
* run_interleaved keeps no (input, output) table: each F leaves a closure that runs its own B, and every receive
  is an irecv waited on at once rather than a blocking recv.
"""
from collections import deque

import torch
import torch.distributed as dist

import harness


class ScheduleDeadlock(Exception):
    """No rank's next op can ever start."""


def _nth(kind, k, p, v):
    g, q = divmod(k, p * v)
    return kind, g * p + q % p, (q // p if kind == "F" else v - 1 - q // p)


def interleaved_schedule(p, m, v):
    if m % p:
        raise ValueError(f"m = {m} is not a multiple of p = {p}")
    total, schedule = m * v, []
    for r in range(p):
        w = min(p - r - 1, m) if v == 1 else min(2 * (p - r - 1) + (v - 1) * p, total)
        ops = [_nth("F", k, p, v) for k in range(w)]
        for k in range(total - w):
            ops += [_nth("F", w + k, p, v), _nth("B", k, p, v)]
        schedule.append(ops + [_nth("B", k, p, v) for k in range(total - w, total)])
    return schedule


def _waits_for(r, op, p, v):
    kind, i, c = op
    s = r + c * p
    if kind == "F":
        return [] if s == 0 else [((s - 1) % p, ("F", i, (s - 1) // p))]
    return [(r, ("F", i, c))] + ([((s + 1) % p, ("B", i, (s + 1) // p))] if s + 1 < p * v else [])


def simulate(schedule, p, v, tf, tb):
    rows = [[tuple(op) for op in ops] for ops in schedule]
    cost = {"F": tf / v, "B": tb / v}
    heads, free, ended, busy = [0] * len(rows), [0.0] * len(rows), {}, [[] for _ in rows]
    moved = True
    while moved:
        moved = False
        for r, ops in enumerate(rows):
            while heads[r] < len(ops):
                op = ops[heads[r]]
                needs = _waits_for(r, op, p, v)
                if not all(n in ended for n in needs):
                    break
                start = max([free[r]] + [ended[n] for n in needs])
                free[r] = ended[(r, op)] = start + cost[op[0]]
                busy[r].append((op, start, free[r]))
                heads[r], moved = heads[r] + 1, True
    stuck = [f"rank {r}: {ops[heads[r]]!r}" for r, ops in enumerate(rows) if heads[r] < len(ops)]
    if stuck:
        raise ScheduleDeadlock("no rank can run its next op: " + ", ".join(stuck))
    return max(free, default=0.0), busy


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    r, p = dist.get_rank(group), dist.get_world_size(group)
    to_global = (lambda k: k) if group is None else (lambda k: dist.get_global_rank(group, k))
    before, after = to_global((r - 1) % p), to_global((r + 1) % p)
    v, dtype = len(chunks), next(chunks[0].parameters()).dtype
    ops, last = schedule[r], p * len(chunks) - 1
    m = sum(op[0] == "F" for op in ops) // v
    here, posted = deque(), []       # p = 1: messages stay on this rank, needed in the order they are made

    def send(tensor, peer):
        tensor = tensor.detach().contiguous()
        if p == 1:
            here.append(tensor)
        else:
            posted.append((tensor, dist.isend(tensor, peer, group=group)))

    def receive(peer):
        if p == 1:
            return here.popleft()
        buffer = torch.empty(act_shape, dtype=dtype, device=harness.device())
        dist.irecv(buffer, peer, group=group).wait()
        return buffer

    def forward(i, c):
        """Run F(i, c); returns its B, a closure over the input and output it needs."""
        s = r + c * p
        x = microbatches[i][0] if s == 0 else receive(before).requires_grad_()
        out = chunks[c](x)
        if s == last:
            out = loss_fn(out, microbatches[i][1]) / m
        else:
            send(out, after)

        def backward():
            out.backward(None if s == last else receive(after))
            if s > 0:
                send(x.grad, before)
        return backward, out.item() if s == last else 0.0

    backwards, total = {}, 0.0
    for kind, i, c in ops:
        if kind == "F":
            backwards[(i, c)], loss = forward(i, c)
            total += loss
        else:
            backwards.pop((i, c))()
    for _, work in posted:
        work.wait()
    return total if r == p - 1 else None
