"""1F1B from a credit rule, a simulator that is a longest-path pass over the dependency graph, and a pipeline
that receives with blocking dist.recv and posts its sends through dist.batch_isend_irecv.

* schedule_1f1b: stage s runs a forward while fewer than p - s micro-batches are in flight and forwards are
  left, else a backward.  That gives the warmup, the one-forward-one-backward steady state and the cooldown.
* simulate: every op is a node; its edges are the previous op of its stage and its dependencies.  Kahn's
  algorithm visits the nodes in topological order, so each start time is the max over its in-edges; nodes
  left over lie on or behind a cycle, and each stage's first such node is its stuck op.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import harness


def schedule_1f1b(num_stages, num_microbatches):
    schedule = []
    for s in range(num_stages):
        ops, forwards, backwards = [], 0, 0
        while backwards < num_microbatches:
            if forwards < num_microbatches and forwards - backwards < num_stages - s:
                ops.append(("F", forwards))
                forwards += 1
            else:
                ops.append(("B", backwards))
                backwards += 1
        schedule.append(ops)
    return schedule


def schedule_gpipe(num_stages, num_microbatches):
    return [[("F", i) for i in range(num_microbatches)] + [("B", i) for i in range(num_microbatches)][::-1]
            for _ in range(num_stages)]


@dataclass
class SimResult:
    makespan: float
    bubble_ratio: float
    events: list = field(default_factory=list)
    peak_activations: list = field(default_factory=list)


class ScheduleDeadlock(Exception):
    pass


def _in_edges(schedule):
    """node (stage, position) -> [(node, delay kind)]: 'stage' (the previous op), 'local' or 'link'."""
    p = len(schedule)
    where = {(s, tuple(op)): (s, k) for s, ops in enumerate(schedule) for k, op in enumerate(ops)}
    edges = {}
    for s, ops in enumerate(schedule):
        for k, (kind, i) in enumerate(ops):
            into = [((s, k - 1), "stage")] if k else []
            if kind == "F" and s > 0:
                into.append((where[(s - 1, ("F", i))], "link"))
            if kind == "B":
                into.append((where[(s, ("F", i))], "local"))
                if s < p - 1:
                    into.append((where[(s + 1, ("B", i))], "link"))
            edges[(s, k)] = into
    return edges


def simulate(schedule, t_fwd, t_bwd, t_comm=0.0):
    schedule = [[tuple(op) for op in ops] for ops in schedule]
    edges = _in_edges(schedule)
    waiting = {node: len(into) for node, into in edges.items()}
    out_edges = {node: [] for node in edges}
    for node, into in edges.items():
        for source, _ in into:
            out_edges[source].append(node)
    ready = deque(node for node, count in waiting.items() if count == 0)
    start, end = {}, {}
    while ready:
        node = ready.popleft()
        s, k = node
        start[node] = max([0.0] + [end[src] + (t_comm if how == "link" else 0.0) for src, how in edges[node]])
        end[node] = start[node] + (t_fwd if schedule[s][k][0] == "F" else t_bwd)
        for after in out_edges[node]:
            waiting[after] -= 1
            if waiting[after] == 0:
                ready.append(after)
    if len(end) < len(edges):
        stuck = [f"stage {s}: {ops[min(k for (t, k) in edges if t == s and (t, k) not in end)]!r}"
                 for s, ops in enumerate(schedule) if any((s, k) not in end for k in range(len(ops)))]
        raise ScheduleDeadlock("no stage can go on: " + ", ".join(stuck))
    events = [[(op, start[(s, k)], end[(s, k)]) for k, op in enumerate(ops)] for s, ops in enumerate(schedule)]
    p, makespan = len(schedule), max(end.values(), default=0.0)
    busy = sum(end[n] - start[n] for n in end)
    peaks = []
    for ops in schedule:
        live, peak = 0, 0
        for kind, _ in ops:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        peaks.append(peak)
    return SimResult(makespan, (p * makespan - busy) / (p * makespan) if makespan else 0.0, events, peaks)


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    s, p = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    m = sum(kind == "F" for kind, _ in ops)
    dtype = next(stage_module.parameters()).dtype
    kept, posted, losses = {}, [], []

    def receive(source):
        buffer = torch.empty(act_shape, dtype=dtype, device=harness.device())
        dist.recv(buffer, peer(source), group=group)
        return buffer

    def send(tensor, to):
        tensor = tensor.detach().contiguous()
        posted.append((tensor, dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer(to), group)])))

    for kind, i in ops:
        if kind == "F":
            x = inputs[i] if s == 0 else receive(s - 1).requires_grad_()
            out = stage_module(x)
            if s == p - 1:
                out = loss_fn(out, targets[i]) / m
                losses.append(out.detach())
            else:
                send(out, s + 1)
            kept[i] = (x, out)
        else:
            x, out = kept.pop(i)
            out.backward(None if s == p - 1 else receive(s + 1))
            if s > 0:
                send(x.grad, s - 1)
    for _, works in posted:
        for work in works:
            work.wait()
    return float(sum(losses)) if s == p - 1 else None
