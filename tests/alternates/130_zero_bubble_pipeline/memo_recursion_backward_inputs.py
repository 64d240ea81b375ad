"""ZB-H1 as 1F1B's op list with each W slotted in after the B that comes s backwards later, a simulator that
is a memoised recursion on end times, and a pipeline whose B and W are Tensor.backward(inputs=...) calls, with
its state in a module-level dict.

* schedule_zb_h1: take 118's 1F1B list (B standing for the input gradient), then walk it: the j-th B is
  followed by W of the micro-batch of the (j - s)-th B.  The W's still owed go at the end.
* simulate: end(s, k) = max(end(s, k - 1), each dependency's end + t_comm across a link) + the op's duration,
  on demand, cached.  An op met again while its own end is being computed lies on a cycle: it and everything
  behind it never run, and each stage's first op without an end is its stuck op.
* run_zero_bubble: F cuts the graph at every layer (each layer's input is a detached leaf).  B is
  out.backward(grad, inputs=[layer input], retain_graph=True) layer by layer, the gradient read from the
  leaf's .grad; W is out.backward(kept output gradient, inputs=layer parameters), which adds into .grad
  itself.  Sends are isend, waited at the end; receives are blocking recv.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import harness

_STATE: dict = {}   # micro-batch -> what its F and B kept, for the run in progress


def _one_f_one_b(p, m, s):
    w = min(p - s - 1, m)
    ops = [("F", i) for i in range(w)]
    for k in range(m):
        ops += ([("F", w + k)] if w + k < m else []) + [("B", k)]
    return ops


def schedule_zb_h1(num_stages, num_microbatches):
    out = []
    for s in range(num_stages):
        ops, done_b = [], []
        for op in _one_f_one_b(num_stages, num_microbatches, s):
            ops.append(op)
            if op[0] == "B":
                done_b.append(op[1])
                if len(done_b) > s:
                    ops.append(("W", done_b[len(done_b) - 1 - s]))
        owed = done_b[len(done_b) - min(s, len(done_b)):] if s else []
        out.append(ops + [("W", i) for i in owed])
    return out


@dataclass
class SimResult:
    makespan: float
    bubble_ratio: float
    events: list = field(default_factory=list)
    peak_activations: list = field(default_factory=list)


class ScheduleDeadlock(Exception):
    pass


def simulate(schedule, tf, tb, tw, t_comm=0.0):
    rows = [[tuple(op) for op in ops] for ops in schedule]
    p = len(rows)
    index = {(s, op): k for s, ops in enumerate(rows) for k, op in enumerate(ops)}
    cost = {"F": tf, "B": tb, "W": tw}
    end, busy_now, cyclic = {}, set(), set()

    def deps(s, op):
        kind, i = op
        if kind == "F":
            return [((s - 1, ("F", i)), t_comm)] if s > 0 else []
        if kind == "B":
            return [((s, ("F", i)), 0.0)] + ([((s + 1, ("B", i)), t_comm)] if s < p - 1 else [])
        return [((s, ("B", i)), 0.0)]

    def finish(s, k):
        if (s, k) in end:
            return end[(s, k)]
        if (s, k) in busy_now or (s, k) in cyclic:
            cyclic.add((s, k))
            return None
        busy_now.add((s, k))
        before = [finish(s, k - 1)] if k else [0.0]
        for (d, o), delay in deps(s, rows[s][k]):
            t = finish(d, index[(d, o)]) if (d, o) in index else None
            before.append(None if t is None else t + delay)
        busy_now.discard((s, k))
        if any(t is None for t in before):
            cyclic.add((s, k))
            return None
        end[(s, k)] = max(before) + cost[rows[s][k][0]]
        return end[(s, k)]

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))
    try:
        for s, ops in enumerate(rows):
            for k in range(len(ops)):
                finish(s, k)
    finally:
        sys.setrecursionlimit(limit)
    stuck = [f"stage {s}: {ops[next(k for k in range(len(ops)) if (s, k) not in end)]!r}"
             for s, ops in enumerate(rows) if len([k for k in range(len(ops)) if (s, k) in end]) < len(ops)]
    if stuck:
        raise ScheduleDeadlock("cyclic waits: " + ", ".join(stuck))
    events = [[(op, end[(s, k)] - cost[op[0]], end[(s, k)]) for k, op in enumerate(ops)] for s, ops in enumerate(rows)]
    makespan = max(end.values(), default=0.0)
    busy = sum(cost[op[0]] for ops in rows for op in ops)
    peaks = []
    for ops in rows:
        in_flight = set()
        peak = 0
        for kind, i in ops:
            if kind == "F":
                in_flight.add(i)
            elif kind == "W":
                in_flight.discard(i)
            peak = max(peak, len(in_flight))
        peaks.append(peak)
    return SimResult(makespan, (p * makespan - busy) / (p * makespan) if makespan else 0.0, events, peaks)


def _f(stage_module, x):
    cuts, h = [], x
    for layer in stage_module:
        y = layer(h)
        cuts.append([layer, h, y, None])
        h = y.detach().requires_grad_()
    return y, cuts


def _b(cuts, grad):
    for cut in reversed(cuts):
        layer, h, y, _ = cut
        cut[3] = grad
        if h.requires_grad:
            y.backward(grad, inputs=[h], retain_graph=True)
            grad, h.grad = h.grad, None
        else:
            grad = None
    return grad


def _w(cuts):
    for layer, _, y, grad in cuts:
        params = list(layer.parameters())
        if params:
            y.backward(grad, inputs=params)


def run_zero_bubble(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    s, p = dist.get_rank(group), dist.get_world_size(group)
    ranks = list(range(p)) if group is None else [dist.get_global_rank(group, k) for k in range(p)]
    m = sum(kind == "F" for kind, _ in ops)
    dtype = next(stage_module.parameters()).dtype
    _STATE.clear()
    posted, total = [], 0.0
    for kind, i in ops:
        if kind == "F":
            if s == 0:
                x = inputs[i]
            else:
                x = torch.empty(act_shape, dtype=dtype, device=harness.device())
                dist.recv(x, ranks[s - 1], group=group)
                x.requires_grad_()
            y, cuts = _f(stage_module, x)
            if s == p - 1:
                loss = loss_fn(y, targets[i]) / m
                total += loss.item()
                _STATE[i] = (cuts, loss)
            else:
                out = y.detach().contiguous()
                posted.append((out, dist.isend(out, ranks[s + 1], group=group)))
                _STATE[i] = (cuts, None)
        elif kind == "B":
            cuts, loss = _STATE[i]
            if loss is not None:
                grad, = torch.autograd.grad(loss, cuts[-1][2])   # the loss's gradient at the stage output
            else:
                grad = torch.empty(act_shape, dtype=dtype, device=harness.device())
                dist.recv(grad, ranks[s + 1], group=group)
            dx = _b(cuts, grad)
            if s > 0:
                dx = dx.contiguous()
                posted.append((dx, dist.isend(dx, ranks[s - 1], group=group)))
        else:
            cuts, _ = _STATE.pop(i)
            _w(cuts)
    for _, work in posted:
        work.wait()
    _STATE.clear()
    return total if s == p - 1 else None
