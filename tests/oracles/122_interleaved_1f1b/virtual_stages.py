"""Problem 122's rules, written out once for its tests (they run in the test process, never on the ranks).

An op is ``(kind, micro-batch, chunk)``; chunk c of rank r is virtual stage ``r + c*p``.

    needs(r, op, p, v)        the (rank, op) pairs that must end before ``op`` starts on rank r
    replay(schedule, p, v)    the ops in an order that respects ``needs``, and the ops that can never run
    timeline(...)             (makespan, per rank [(op, start, end)]) by the statement's rules, in fractions
    canonical(p, m, v)        the statement's order (Megatron-LM's interleaved 1F1B; 118's 1F1B when v = 1)
    render(rows, unit=None)   one text line per rank: op lists, or timelines on a time axis; never raises
    both(got, want)           the learner's op lists (or timeline) and the expected ones, one under the other
"""
from __future__ import annotations

from fractions import Fraction
from itertools import accumulate

from testkit.schedule_drawing import ScheduleText


def place(s: int, p: int) -> tuple:
    """Virtual stage s lives on rank s % p as its chunk s // p."""
    return s % p, s // p


def needs(r: int, op, p: int, v: int) -> list:
    kind, i, c = op
    s = r + c * p
    if kind == "B":
        own = [(r, ("F", i, c))]
        if s + 1 == p * v:
            return own
        q, d = place(s + 1, p)
        return own + [(q, ("B", i, d))]
    if s == 0:
        return []
    q, d = place(s - 1, p)
    return [(q, ("F", i, d))]


def replay(schedule, p: int, v: int):
    """Run one op at a time, from the first rank whose next op has all it needs: (order, stuck ops)."""
    rows = [[tuple(op) for op in ops] for ops in schedule]
    heads, done, order = [0] * len(rows), set(), []
    while True:
        movable = [r for r, ops in enumerate(rows)
                   if heads[r] < len(ops) and all(n in done for n in needs(r, ops[heads[r]], p, v))]
        if not movable:
            break
        step = (movable[0], rows[movable[0]][heads[movable[0]]])
        order.append(step)
        done.add(step)
        heads[step[0]] += 1
    return order, [(r, ops[heads[r]]) for r, ops in enumerate(rows) if heads[r] < len(ops)]


def timeline(schedule, p: int, v: int, tf, tb):
    """Every op starts when its rank is free and what it needs has ended; F lasts tf/v, B tb/v.  None if stuck."""
    order, stuck = replay(schedule, p, v)
    if stuck:
        return None
    cost = {"F": Fraction(tf) / v, "B": Fraction(tb) / v}
    free, end, rows = [Fraction(0)] * p, {}, [[] for _ in range(p)]
    for r, op in order:
        start = max([free[r]] + [end[n] for n in needs(r, op, p, v)])
        end[(r, op)] = free[r] = start + cost[op[0]]
        rows[r].append((op, start, free[r]))
    return max(free, default=Fraction(0)), rows


def warmup(p: int, m: int, v: int, r: int) -> int:
    return min(p - r - 1, m) if v == 1 else min(2 * (p - r - 1) + (v - 1) * p, m * v)


def nth(kind: str, k: int, p: int, v: int) -> tuple:
    """A rank's k-th forward (or backward): groups of p micro-batches, each through every chunk in turn."""
    group, pos = divmod(k, p * v)
    chunk = pos // p if kind == "F" else v - 1 - pos // p
    return kind, group * p + pos % p, chunk


def canonical(p: int, m: int, v: int, extra: int = 0) -> list:
    """The statement's schedule; ``extra`` more warm-up forwards on every rank (capped at m*v) for a variant."""
    rows = []
    for r in range(p):
        w = min(warmup(p, m, v, r) + extra, m * v)
        seen = {"F": 0, "B": 0}
        row = []
        for kind in "F" * w + "FB" * (m * v - w) + "B" * w:
            row.append(nth(kind, seen[kind], p, v))
            seen[kind] += 1
        rows.append(row)
    return rows


def peak_in_flight(ops) -> int:
    """Most (micro-batch, chunk) activations held at once: +1 at each F, -1 at each B."""
    return max(accumulate((1 if op[0] == "F" else -1 for op in ops), initial=0))


def _label(op) -> str:
    return f"{op[0]}{op[1]}.{op[2]}"


_TEXT = ScheduleText("rank", _label)
render, both = _TEXT.render, _TEXT.both
