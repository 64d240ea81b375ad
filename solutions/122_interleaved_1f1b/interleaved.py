"""Problem 122 reference: the interleaved 1F1B schedule (v virtual stages per rank), its simulator, a real run."""
from __future__ import annotations

from collections import deque

import torch
import torch.distributed as dist

import harness


class ScheduleDeadlock(Exception):
    """No rank can run its next op: each one waits on an op that can never end first."""


# ---- the schedule ---------------------------------------------------------------------------------

def _megatron_order(p: int, m: int, v: int, kind: str) -> list:
    """Every (micro-batch, chunk) op of one kind, in groups of p micro-batches, chunk by chunk
    (forwards chunk 0 first, backwards chunk v - 1 first)."""
    chunks = range(v) if kind == "F" else range(v - 1, -1, -1)
    return [(kind, first + j, c) for first in range(0, m, p) for c in chunks for j in range(p)]


def _warmup(p: int, m: int, v: int, r: int) -> int:
    if v == 1:
        return min(p - r - 1, m)                          # plain 1F1B (problem 118)
    return min(2 * (p - r - 1) + (v - 1) * p, m * v)     # Megatron-LM's interleaved warm-up


def _one_rank(forwards: list, backwards: list, warmup: int) -> list:
    """Warm-up forwards, then one forward one backward, then the remaining backwards."""
    n = len(forwards)
    steady = [op for k in range(n - warmup) for op in (forwards[warmup + k], backwards[k])]
    return forwards[:warmup] + steady + backwards[n - warmup:]


def interleaved_schedule(p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    if m % p:
        raise ValueError(f"m = {m} micro-batches is not a multiple of p = {p} ranks: the interleaved schedule "
                         "runs micro-batches in groups of p")
    forwards, backwards = _megatron_order(p, m, v, "F"), _megatron_order(p, m, v, "B")
    return [_one_rank(forwards, backwards, _warmup(p, m, v, r)) for r in range(p)]


# ---- the simulator --------------------------------------------------------------------------------

def _needs(r: int, op, p: int, v: int) -> list:
    """(rank, op) pairs that must end before ``op`` starts on rank r.  Chunk c of rank r is stage s = r + c*p;
    stage s - 1 and s + 1 live on ranks (r -+ 1) % p."""
    kind, i, c = op
    s = r + c * p
    if kind == "F":
        return [((s - 1) % p, ("F", i, (s - 1) // p))] if s > 0 else []
    later = [((s + 1) % p, ("B", i, (s + 1) // p))] if s < p * v - 1 else []
    return [(r, ("F", i, c))] + later


def _timeline(schedule, needs, t_f: float, t_b: float):
    """Times every op in Kahn's order over two kinds of wait: the previous op on the same rank, and ``needs``.
    Raises ScheduleDeadlock when some ops can never start."""
    rows = [[tuple(op) for op in ops] for ops in schedule]
    index = {(r, op): k for r, ops in enumerate(rows) for k, op in enumerate(ops)}
    waits = {(r, k): [(r, k - 1)] * (k > 0) + [(q, index.get((q, o))) for q, o in needs(r, op)]
             for r, ops in enumerate(rows) for k, op in enumerate(ops)}
    users, missing = {}, {}
    for node, before in waits.items():
        missing[node] = len(before)
        for b in before:
            users.setdefault(b, []).append(node)
    length = {"F": t_f, "B": t_b}
    ready, end = deque(node for node, n in missing.items() if n == 0), {}
    while ready:
        r, k = node = ready.popleft()
        end[node] = max((end[b] for b in waits[node]), default=0.0) + length[rows[r][k][0]]
        for user in users.get(node, []):
            missing[user] -= 1
            if missing[user] == 0:
                ready.append(user)
    stuck = []
    for r, ops in enumerate(rows):
        k = sum((r, k) in end for k in range(len(ops)))   # a rank's ops end in list order
        if k < len(ops):
            stuck.append(f"rank {r}: {ops[k]!r}")
    if stuck:
        raise ScheduleDeadlock("the schedule can never finish; each rank's next op waits on one that cannot end "
                               "first: " + ", ".join(stuck))
    busy = [[(op, end[(r, k)] - length[op[0]], end[(r, k)]) for k, op in enumerate(ops)] for r, ops in enumerate(rows)]
    return max(end.values(), default=0.0), busy


def simulate(schedule, p: int, v: int, tf: float, tb: float):
    return _timeline(schedule, lambda r, op: _needs(r, op, p, v), tf / v, tb / v)


# ---- the real run -------------------------------------------------------------------------------------

class _Ring:
    """This rank's link to the ranks of stages s - 1 and s + 1: (r - 1) % p and (r + 1) % p in the group.
    Sends are posted (dist.isend) and waited on in ``close``; receives block.  With p = 1 both neighbours
    are this rank: a message is kept in a queue (messages are needed in the order they are made)."""

    def __init__(self, group, act_shape, dtype):
        r, p = dist.get_rank(group), dist.get_world_size(group)
        rank = (lambda k: dist.get_global_rank(group, k)) if group is not None else (lambda k: k)
        self.prev, self.next = rank((r - 1) % p), rank((r + 1) % p)
        self.group, self.shape, self.dtype, self.alone = group, act_shape, dtype, p == 1
        self.kept, self.posted = deque(), []

    def send(self, tensor, peer):
        if self.alone:
            self.kept.append(tensor.detach())
        else:
            tensor = tensor.detach().contiguous()   # referenced until its send is waited on
            self.posted.append((tensor, dist.isend(tensor, peer, group=self.group)))

    def recv(self, peer):
        if self.alone:
            return self.kept.popleft()
        buffer = torch.empty(self.shape, dtype=self.dtype, device=harness.device())
        dist.recv(buffer, peer, group=self.group)
        return buffer

    def close(self):
        for _, work in self.posted:
            work.wait()


class _Kept(dict):
    """What each F keeps for its B: (micro-batch, chunk) -> (input, output)."""

    def backward(self, key, grad=None):
        """B: backward from the output ``key``'s F kept, and let go of it, so that autograd frees the
        activations that forward saved as the backward runs.  Returns the F's input (its .grad goes back)."""
        x, out = self.pop(key)
        out.backward(grad)
        return x


def _run(chunks, ops, microbatches, loss_fn, ring, r, p, kept=None):
    v, last = len(chunks), p * len(chunks) - 1
    m = sum(op[0] == "F" for op in ops) // v
    kept, total = _Kept() if kept is None else kept, 0.0
    for kind, i, c in ops:
        s = r + c * p
        if kind == "F":
            x = microbatches[i][0] if s == 0 else ring.recv(ring.prev).requires_grad_()
            out = chunks[c](x)
            if s == last:
                out = loss_fn(out, microbatches[i][1]) / m
                total += out.item()
            else:
                ring.send(out, ring.next)
            kept[(i, c)] = (x, out)
        else:
            x = kept.backward((i, c), None if s == last else ring.recv(ring.next))
            if s > 0:
                ring.send(x.grad, ring.prev)
    ring.close()
    return total if r == p - 1 else None


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    r, p = dist.get_rank(group), dist.get_world_size(group)
    ring = _Ring(group, act_shape, next(chunks[0].parameters()).dtype)
    return _run(chunks, schedule[r], microbatches, loss_fn, ring, r, p)
