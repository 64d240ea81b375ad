"""A correct interleaved 1F1B whose pieces take other routes than the reference's.

* interleaved_schedule sorts every (micro-batch, chunk) by a key (group of p, chunk up or down, micro-batch)
  to get the two orders, and zips them into the 1F1B pattern;
* simulate is a discrete-event simulation: a heap of running ops ordered by end time; whenever one ends,
  every idle rank whose next op is ready starts it then.  A deadlock is an empty heap with ops left;
* run_interleaved keeps its state in module-level objects (the kept activations, the posted sends, the p = 1
  hand-offs), cleared at every call, receives with blocking recv, and backwards with torch.autograd.backward.
"""
import heapq
from collections import deque

import torch
import torch.distributed as dist

import harness


class ScheduleDeadlock(Exception):
    """Ops remain and none of them can ever start."""


def interleaved_schedule(p, m, v):
    if m % p:
        raise ValueError(f"interleaved_schedule: m = {m} is not a multiple of p = {p}")
    pairs = [(i, c) for i in range(m) for c in range(v)]
    forwards = [("F", i, c) for i, c in sorted(pairs, key=lambda ic: (ic[0] // p, ic[1], ic[0] % p))]
    backwards = [("B", i, c) for i, c in sorted(pairs, key=lambda ic: (ic[0] // p, -ic[1], ic[0] % p))]
    rows = []
    for r in range(p):
        w = min(p - r - 1, m) if v == 1 else min(2 * (p - r - 1) + (v - 1) * p, m * v)
        steady = [op for pair in zip(forwards[w:], backwards) for op in pair]
        rows.append(forwards[:w] + steady + backwards[len(forwards) - w:])
    return rows


def _needs(r, op, p, v):
    kind, i, c = op
    s = r + c * p
    if kind == "F":
        return {((s - 1) % p, ("F", i, (s - 1) // p))} if s else set()
    later = {((s + 1) % p, ("B", i, (s + 1) // p))} if s < p * v - 1 else set()
    return {(r, ("F", i, c))} | later


def simulate(schedule, p, v, tf, tb):
    rows = [[tuple(op) for op in ops] for ops in schedule]
    length = {"F": tf / v, "B": tb / v}
    nxt, idle, done, running, busy = [0] * len(rows), set(range(len(rows))), set(), [], [[] for _ in rows]
    now = 0.0
    while True:
        for r in sorted(idle):
            if nxt[r] < len(rows[r]) and _needs(r, rows[r][nxt[r]], p, v) <= done:
                op = rows[r][nxt[r]]
                heapq.heappush(running, (now + length[op[0]], r, op))
                busy[r].append((op, now, now + length[op[0]]))
                idle.discard(r)
        if not running:
            break
        now, r, op = heapq.heappop(running)
        done.add((r, op))
        nxt[r] += 1
        idle.add(r)
    left = [f"rank {r}: {rows[r][nxt[r]]!r}" for r in range(len(rows)) if nxt[r] < len(rows[r])]
    if left:
        raise ScheduleDeadlock("the schedule cannot finish; stuck: " + ", ".join(left))
    return max((end for row in busy for _, _, end in row), default=0.0), busy


KEPT = {}          # (micro-batch, chunk) -> (input, output), from its F to its B
POSTED = []        # (tensor, work) of every isend, waited on before returning
HANDED = deque()   # p = 1: what this rank sends itself, in the order it is needed


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    for state in (KEPT, POSTED, HANDED):    # a pooled rank runs many calls in one process
        state.clear()
    r, p = dist.get_rank(group), dist.get_world_size(group)
    peer = {d: (r + d) % p if group is None else dist.get_global_rank(group, (r + d) % p) for d in (-1, 1)}
    v = len(chunks)
    m, dtype = sum(op[0] == "F" for op in schedule[r]) // v, next(chunks[0].parameters()).dtype
    total = 0.0
    for kind, i, c in schedule[r]:
        s = r + c * p
        first, last = s == 0, s == p * v - 1
        if kind == "F":
            x = microbatches[i][0] if first else _receive(peer[-1], act_shape, dtype, p, group).requires_grad_()
            out = chunks[c](x)
            if last:
                out = loss_fn(out, microbatches[i][1]) / m
                total += float(out)
            else:
                _send(out, peer[1], p, group)
            KEPT[(i, c)] = (x, out)
        else:
            x, out = KEPT.pop((i, c))
            grad = None if last else _receive(peer[1], act_shape, dtype, p, group)
            torch.autograd.backward(out, grad)
            if not first:
                _send(x.grad, peer[-1], p, group)
    for _, work in POSTED:
        work.wait()
    return total if r == p - 1 else None


def _send(tensor, to, p, group):
    tensor = tensor.detach().contiguous()
    if p == 1:
        HANDED.append(tensor)
    else:
        POSTED.append((tensor, dist.isend(tensor, to, group=group)))


def _receive(source, shape, dtype, p, group):
    if p == 1:
        return HANDED.popleft()
    buffer = torch.empty(shape, dtype=dtype, device=harness.device())
    dist.recv(buffer, source, group=group)
    return buffer
