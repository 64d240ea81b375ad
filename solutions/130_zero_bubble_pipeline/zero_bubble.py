"""Problem 130 reference: the ZB-H1 zero-bubble schedule, its simulator, and a real pipeline with B and W split."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import harness


# ---- the schedule -------------------------------------------------------------------------------------

def schedule_zb_h1(num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    """1F1B's forwards and input gradients; stage s runs each W s backwards late, the last s at the end."""
    p, m = num_stages, num_microbatches
    schedule = []
    for s in range(p):
        w = min(p - s - 1, m)                       # 1F1B's warm-up
        ops = [("F", i) for i in range(w)]
        for k in range(m):
            if w + k < m:
                ops.append(("F", w + k))
            ops.append(("B", k))
            if k >= s:
                ops.append(("W", k - s))            # deferred by s: it fills the gap while B(k + 1) travels
        ops += [("W", i) for i in range(max(m - s, 0), m)]
        schedule.append(ops)
    return schedule


# ---- the simulator ------------------------------------------------------------------------------------

@dataclass
class SimResult:
    makespan: float
    bubble_ratio: float
    events: list = field(default_factory=list)            # per stage: [(op, start, end), ...] in list order
    peak_activations: list = field(default_factory=list)  # per stage


class ScheduleDeadlock(Exception):
    """No stage can run its next op: every one waits on an op that can never finish first."""


def _dependencies(op, stage, p):
    """(stage, op) pairs that must end before ``op`` runs on ``stage``, and whether each crosses a link."""
    kind, i = op
    if kind == "F":
        return [((stage - 1, ("F", i)), True)] if stage > 0 else []
    if kind == "B":
        return [((stage, ("F", i)), False)] + ([((stage + 1, ("B", i)), True)] if stage < p - 1 else [])
    return [((stage, ("B", i)), False)]            # W needs its own B: the output gradient it keeps


def simulate(schedule, tf, tb, tw, t_comm=0.0) -> SimResult:
    p = len(schedule)
    schedule = [[tuple(op) for op in ops] for ops in schedule]
    length = {"F": tf, "B": tb, "W": tw}
    end, nxt, free = {}, [0] * p, [0.0] * p
    events = [[] for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while nxt[s] < len(schedule[s]):
                op = schedule[s][nxt[s]]
                deps = _dependencies(op, s, p)
                if any(d not in end for d, _ in deps):
                    break
                start = max([free[s]] + [end[d] + (t_comm if link else 0.0) for d, link in deps])
                end[(s, op)] = free[s] = start + length[op[0]]
                events[s].append((op, start, free[s]))
                nxt[s] += 1
                progress = True
    stuck = [f"stage {s}: {schedule[s][nxt[s]]!r}" for s in range(p) if nxt[s] < len(schedule[s])]
    if stuck:
        raise ScheduleDeadlock("the schedule deadlocks; each stage's next op waits on one that can never run "
                               "first: " + ", ".join(stuck))
    makespan = max(free, default=0.0)
    busy = sum(b - a for stage in events for _, a, b in stage)
    bubble = (p * makespan - busy) / (p * makespan) if makespan > 0 else 0.0
    peaks = []
    for ops in schedule:                          # a micro-batch's activations live from its F to its W
        live = peak = 0
        for kind, _ in ops:
            live += (kind == "F") - (kind == "W")
            peak = max(peak, live)
        peaks.append(peak)
    return SimResult(makespan, bubble, events, peaks)


# ---- the real pipeline --------------------------------------------------------------------------------

def _forward(stage_module, x):
    """F: run the layers one at a time, each on a leaf of its own, so that B can stop at every layer's input
    and W can start from every layer's output.  Returns the stage output and [(layer, input, output)]."""
    kept = []
    for layer in stage_module:
        out = layer(x)
        kept.append((layer, x, out))
        x = out.detach().requires_grad_()
    return out, kept


def _input_gradients(kept, grad):
    """B: from the output's gradient back to the stage input, layer by layer, with no parameter in the way.
    Each layer's output gradient is kept for W.  Returns the gradient of the stage input (None on stage 0)."""
    for k in reversed(range(len(kept))):
        layer, x, out = kept[k]
        kept[k] = (layer, x, out, grad)
        grad = torch.autograd.grad(out, x, grad, retain_graph=True)[0] if x.requires_grad else None
    return grad


def _weight_gradients(kept):
    """W: each layer's parameter gradients from its output's gradient (kept by B), added into .grad."""
    for layer, _, out, grad in kept:
        params = [q for q in layer.parameters() if q.requires_grad]
        if params:
            for q, g in zip(params, torch.autograd.grad(out, params, grad)):
                q.grad = g if q.grad is None else q.grad + g


def run_zero_bubble(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    stage, p = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda k: dist.get_global_rank(group, k)) if group is not None else (lambda k: k)
    first, last = stage == 0, stage == p - 1
    m = sum(kind == "F" for kind, _ in ops)
    dtype, where = next(stage_module.parameters()).dtype, harness.device()
    kept, sends, total = {}, [], 0.0

    def recv(src):
        buffer = torch.empty(act_shape, dtype=dtype, device=where)
        dist.recv(buffer, peer(src), group=group)
        return buffer

    def isend(tensor, dst):
        tensor = tensor.detach().contiguous()                 # referenced until its send is waited on
        sends.append((tensor, dist.isend(tensor, peer(dst), group=group)))

    for kind, i in ops:
        if kind == "F":
            x = inputs[i] if first else recv(stage - 1).requires_grad_()
            out, layers = _forward(stage_module, x)
            if last:
                out = loss_fn(out, targets[i]) / m
                total += out.item()
            else:
                isend(out, stage + 1)
            kept[i] = (out, layers)
        elif kind == "B":
            out, layers = kept[i]
            if last:
                grad = torch.autograd.grad(out, layers[-1][2])[0]   # the loss's gradient at the stage output
            else:
                grad = recv(stage + 1)
            dx = _input_gradients(layers, grad)
            if not first:
                isend(dx, stage - 1)
        else:
            _, layers = kept.pop(i)                                 # after W, nothing of micro-batch i is kept
            _weight_gradients(layers)
    for _, work in sends:
        work.wait()
    return total if last else None
