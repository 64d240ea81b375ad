"""Problem 118 reference: the 1F1B pipeline schedule, its simulator, and a real pipelined run."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import harness


def _stage_ops(m: int, warmup: int) -> list[tuple[str, int]]:
    """One stage's 1F1B list: ``warmup`` forwards, then F and B alternating, then the remaining B."""
    ops = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [("F", warmup + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warmup, m)]


def schedule_1f1b(num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    return [_stage_ops(num_microbatches, min(num_stages - s - 1, num_microbatches)) for s in range(num_stages)]


def schedule_gpipe(num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    ops = [("F", i) for i in range(num_microbatches)] + [("B", i) for i in reversed(range(num_microbatches))]
    return [list(ops) for _ in range(num_stages)]


@dataclass
class SimResult:
    makespan: float
    bubble_ratio: float
    events: list = field(default_factory=list)            # per stage: [(op, start, end), ...] in list order
    peak_activations: list = field(default_factory=list)  # per stage


class ScheduleDeadlock(Exception):
    """No stage can run its next op: every one waits on an op that can never finish first."""


def _dependencies(op, stage, num_stages):
    """The ops (stage, op) that must finish before ``op`` runs on ``stage``, and whether each crosses a link."""
    kind, mb = op
    if kind == "F":
        return [((stage - 1, ("F", mb)), True)] if stage > 0 else []
    deps = [((stage, ("F", mb)), False)]
    if stage < num_stages - 1:
        deps.append(((stage + 1, ("B", mb)), True))
    return deps


def simulate(schedule, t_fwd, t_bwd, t_comm=0.0) -> SimResult:
    p = len(schedule)
    schedule = [[tuple(op) for op in ops] for ops in schedule]
    end = {}                      # (stage, op) -> finish time
    nxt, free = [0] * p, [0.0] * p
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
                finish = start + (t_fwd if op[0] == "F" else t_bwd)
                end[(s, op)] = free[s] = finish
                events[s].append((op, start, finish))
                nxt[s] += 1
                progress = True
    stuck = [f"stage {s}: {schedule[s][nxt[s]]!r}" for s in range(p) if nxt[s] < len(schedule[s])]
    if stuck:
        raise ScheduleDeadlock("the schedule deadlocks; each stage's next op waits on one that can never run "
                               "first: " + ", ".join(stuck))
    makespan = max(free, default=0.0)
    busy = sum(e - b for stage in events for _, b, e in stage)
    bubble = (p * makespan - busy) / (p * makespan) if makespan > 0 else 0.0
    peaks = []
    for ops in schedule:
        live = peak = 0
        for kind, _ in ops:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        peaks.append(peak)
    return SimResult(makespan, bubble, events, peaks)


def _isend(tensor, peer, group):
    """Post a send; the tensor stays referenced beside its work until it is waited on."""
    tensor = tensor.contiguous()
    return tensor, dist.isend(tensor, peer, group=group)


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    stage, p = dist.get_rank(group), dist.get_world_size(group)
    prev = dist.get_global_rank(group, stage - 1) if group is not None and stage > 0 else stage - 1
    nxt = dist.get_global_rank(group, stage + 1) if group is not None and stage < p - 1 else stage + 1
    first, last = stage == 0, stage == p - 1
    m = sum(1 for kind, _ in ops if kind == "F")
    dtype, where = next(stage_module.parameters()).dtype, harness.device()
    saved, sends, total = {}, [], 0.0
    for kind, mb in ops:
        if kind == "F":
            if first:
                x = inputs[mb]
            else:
                x = torch.empty(act_shape, dtype=dtype, device=where)
                dist.irecv(x, prev, group=group).wait()
                x.requires_grad_()
            out = stage_module(x)
            if last:
                out = loss_fn(out, targets[mb]) / m
                total += out.item()
            else:
                sends.append(_isend(out.detach(), nxt, group))
            saved[mb] = (x, out)
        else:
            x, out = saved.pop(mb)
            if last:
                out.backward()
            else:
                grad = torch.empty(act_shape, dtype=dtype, device=where)
                dist.irecv(grad, nxt, group=group).wait()
                out.backward(grad)
            if not first:
                sends.append(_isend(x.grad, prev, group))
    for _, work in sends:
        work.wait()
    return total if last else None
