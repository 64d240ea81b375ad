"""A simulator that is a memoised recursion on end times, schedules built with itertools, SimResult as a
NamedTuple, and a pipeline that runs its backward with torch.autograd.backward and sums the loss as a tensor.

end(s, k) = max(end(s, k - 1), each dependency's end + t_comm across a link) + the op's duration, computed on
demand with a cache.  An op met again while its own end is still being computed lies on a cycle; every op
that depends on such an op can never run either, so each stage's first op without an end is its stuck op.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import torch.distributed as dist

import harness


def schedule_1f1b(num_stages, num_microbatches):
    m, out = num_microbatches, []
    for s in range(num_stages):
        w = min(num_stages - s - 1, m)
        steady = itertools.chain.from_iterable((("F", w + i), ("B", i)) for i in range(m - w))
        out.append(list(itertools.chain((("F", i) for i in range(w)), steady, (("B", i) for i in range(m - w, m)))))
    return out


def schedule_gpipe(num_stages, num_microbatches):
    one = [("F", i) for i in range(num_microbatches)] + [("B", i) for i in reversed(range(num_microbatches))]
    return [one.copy() for _ in range(num_stages)]


class SimResult(NamedTuple):
    """The stub's dataclass as a NamedTuple: the same fields, read the same way."""
    makespan: float
    bubble_ratio: float
    events: list
    peak_activations: list


class ScheduleDeadlock(RuntimeError):
    """No stage can run its next op."""


class _Clock:
    """End times of a schedule's ops, computed on demand; None for an op that can never run."""

    def __init__(self, schedule, t_fwd, t_bwd, t_comm):
        self.schedule, self.t_comm = schedule, t_comm
        self.length = {"F": t_fwd, "B": t_bwd}
        self.position = {(s, op): k for s, ops in enumerate(schedule) for k, op in enumerate(ops)}
        self.ends, self.busy = {}, set()

    def _needs(self, s, k):
        kind, i = self.schedule[s][k]
        p = len(self.schedule)
        needs = [((s, k - 1), 0.0)] if k else []
        if kind == "F" and s > 0:
            needs.append(((s - 1, self.position[(s - 1, ("F", i))]), self.t_comm))
        if kind == "B":
            needs.append(((s, self.position[(s, ("F", i))]), 0.0))
            if s < p - 1:
                needs.append(((s + 1, self.position[(s + 1, ("B", i))]), self.t_comm))
        return needs

    def end(self, node):
        if node in self.ends:
            return self.ends[node]
        if node in self.busy:            # met again while it is being computed: a cycle
            return None
        self.busy.add(node)
        before = [(self.end(dep), delay) for dep, delay in self._needs(*node)]
        self.busy.discard(node)
        s, k = node
        ready = None if any(e is None for e, _ in before) else max([0.0] + [e + d for e, d in before])
        self.ends[node] = None if ready is None else ready + self.length[self.schedule[s][k][0]]
        return self.ends[node]


def simulate(schedule, t_fwd, t_bwd, t_comm=0.0):
    schedule = [[tuple(op) for op in ops] for ops in schedule]
    clock = _Clock(schedule, t_fwd, t_bwd, t_comm)
    ends = [[clock.end((s, k)) for k in range(len(ops))] for s, ops in enumerate(schedule)]
    stuck = [f"stage {s}: {schedule[s][row.index(None)]!r}" for s, row in enumerate(ends) if None in row]
    if stuck:
        raise ScheduleDeadlock("these ops wait on each other in a cycle, or on one that does: " + ", ".join(stuck))
    events = [[(op, e - clock.length[op[0]], e) for op, e in zip(ops, row)] for ops, row in zip(schedule, ends)]
    p = len(schedule)
    makespan = max(itertools.chain.from_iterable(ends), default=0.0)
    busy = sum(clock.length[op[0]] for ops in schedule for op in ops)
    peaks = [max(itertools.accumulate(1 if kind == "F" else -1 for kind, _ in ops), default=0) for ops in schedule]
    return SimResult(makespan, (p * makespan - busy) / (p * makespan) if makespan else 0.0, events, peaks)


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    stage, p = dist.get_rank(group), dist.get_world_size(group)
    to_global = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    prev, nxt = to_global(max(stage - 1, 0)), to_global(min(stage + 1, p - 1))
    first, last = stage == 0, stage == p - 1
    m = sum(1 for kind, _ in ops if kind == "F")
    like = next(stage_module.parameters())
    pending, activations, total = [], {}, None

    def received(peer):
        t = torch.empty(act_shape, dtype=like.dtype, device=harness.device())
        dist.irecv(t, peer, group=group).wait()
        return t

    for kind, i in ops:
        if kind == "F":
            x = inputs[i] if first else received(prev).requires_grad_(True)
            y = stage_module(x)
            if last:
                y = loss_fn(y, targets[i]) / m
                total = y.detach() if total is None else total + y.detach()
            else:
                pending.append((y.detach(), dist.isend(y.detach(), nxt, group=group)))
            activations[i] = (x, y)
        else:
            x, y = activations.pop(i)
            torch.autograd.backward([y], None if last else [received(nxt)])
            if not first:
                pending.append((x.grad, dist.isend(x.grad, prev, group=group)))
    for _, work in pending:
        work.wait()
    return total.item() if last else None
