"""ZB-H1 from a queue of pending weight gradients, a simulator that is Kahn's algorithm over the dependency
graph, and a pipeline that keeps ONE autograd graph per micro-batch (no cut between layers).

* schedule_zb_h1: 118's 1F1B from a credit rule (a forward while fewer than p - s micro-batches are between F
  and B), with every B pushing its micro-batch on a queue; after the B, the oldest entry is popped as a W while
  the queue holds more than s.  What is left is flushed at the end.
* simulate: nodes are (stage, position); in-edges are the previous op of the stage and the dependencies.  Ops
  never reached lie on or behind a cycle; each stage's first such op is its stuck op.
* run_zero_bubble: F runs the stage as a whole and notes each parametrised layer's output on the way.  B asks
  autograd, in one call, for the gradients of the stage input and of every such output (those are activation
  gradients: no parameter is on the way to them).  W then starts at each noted output with its gradient and asks
  for the layer's parameters only.  Sends go through dist.batch_isend_irecv; receives are irecv, then wait.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import harness


def schedule_zb_h1(num_stages, num_microbatches):
    p, m, out = num_stages, num_microbatches, []
    for s in range(p):
        ops, nf, nb, pending = [], 0, 0, deque()
        while nb < m:
            if nf < m and nf - nb < p - s:
                ops.append(("F", nf))
                nf += 1
                continue
            ops.append(("B", nb))
            pending.append(nb)
            nb += 1
            if len(pending) > s:
                ops.append(("W", pending.popleft()))
        out.append(ops + [("W", i) for i in pending])
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
    where = {(s, op): (s, k) for s, ops in enumerate(rows) for k, op in enumerate(ops)}
    into = {}
    for s, ops in enumerate(rows):
        for k, (kind, i) in enumerate(ops):
            edges = [((s, k - 1), 0.0)] if k else []
            wanted = {"F": [(s - 1, "F", t_comm)] if s > 0 else [],
                      "B": [(s, "F", 0.0)] + ([(s + 1, "B", t_comm)] if s < p - 1 else []),
                      "W": [(s, "B", 0.0)]}[kind]
            edges += [(where[(d, (k2, i))], delay) for d, k2, delay in wanted if (d, (k2, i)) in where]
            into[(s, k)] = edges
    waiting = {node: len(edges) for node, edges in into.items()}
    users = {node: [] for node in into}
    for node, edges in into.items():
        for source, _ in edges:
            users[source].append(node)
    cost = {"F": tf, "B": tb, "W": tw}
    ready, start, end = deque(n for n, c in waiting.items() if c == 0), {}, {}
    while ready:
        node = ready.popleft()
        start[node] = max([0.0] + [end[src] + delay for src, delay in into[node]])
        end[node] = start[node] + cost[rows[node[0]][node[1]][0]]
        for user in users[node]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    stuck = [f"stage {s}: {ops[min(k for k in range(len(ops)) if (s, k) not in end)]!r}"
             for s, ops in enumerate(rows) if any((s, k) not in end for k in range(len(ops)))]
    if stuck:
        raise ScheduleDeadlock("nothing can run: " + ", ".join(stuck))
    events = [[(op, start[(s, k)], end[(s, k)]) for k, op in enumerate(ops)] for s, ops in enumerate(rows)]
    makespan = max(end.values(), default=0.0)
    busy = sum(end[n] - start[n] for n in end)
    peaks = []
    for ops in rows:
        live = [0]
        for kind, _ in ops:
            live.append(live[-1] + {"F": 1, "B": 0, "W": -1}[kind])
        peaks.append(max(live))
    return SimResult(makespan, (p * makespan - busy) / (p * makespan) if makespan else 0.0, events, peaks)


def run_zero_bubble(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    s, p = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda k: k) if group is None else (lambda k: dist.get_global_rank(group, k))
    m = sum(kind == "F" for kind, _ in ops)
    dtype = next(stage_module.parameters()).dtype
    graphs, posted, losses = {}, [], []

    def receive(source):
        buffer = torch.empty(act_shape, dtype=dtype, device=harness.device())
        dist.irecv(buffer, peer(source), group=group).wait()
        return buffer

    def send(tensor, to):
        tensor = tensor.detach().contiguous()
        posted.append((tensor, dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer(to), group)])))

    for kind, i in ops:
        if kind == "F":
            x = inputs[i] if s == 0 else receive(s - 1).requires_grad_()
            h, noted = x, []
            for layer in stage_module:
                h = layer(h)
                if any(True for _ in layer.parameters()):
                    noted.append([layer, h, None])
            if s == p - 1:
                root = loss_fn(h, targets[i]) / m
                losses.append(root.detach())
            else:
                root = h
                send(h, s + 1)
            graphs[i] = (x, root, noted)
        elif kind == "B":
            x, root, noted = graphs[i]
            seed = None if s == p - 1 else receive(s + 1)
            wanted = ([x] if x.requires_grad else []) + [y for _, y, _ in noted]
            grads = torch.autograd.grad(root, wanted, seed, retain_graph=True)
            if x.requires_grad:
                send(grads[0], s - 1)
                grads = grads[1:]
            for entry, g in zip(noted, grads):
                entry[2] = g
        else:
            _, _, noted = graphs.pop(i)
            for layer, y, g in noted:
                params = list(layer.parameters())
                for q, d in zip(params, torch.autograd.grad(y, params, g)):
                    q.grad = d if q.grad is None else q.grad.add_(d)
    for _, works in posted:
        for work in works:
            work.wait()
    return float(torch.stack(losses).sum()) if s == p - 1 else None
