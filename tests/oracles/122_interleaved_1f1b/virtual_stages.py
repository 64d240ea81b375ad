"""Problem 122's rules, written out once for its tests (they run in the test process, never on the ranks).

An op is ``(kind, micro-batch, chunk)``; chunk c of rank r is virtual stage ``r + c*p``.

    needs(r, op, p, v)        the (rank, op) pairs that must end before ``op`` starts on rank r
    replay(schedule, p, v)    the ops in an order that respects ``needs``, and the ops that can never run
    timeline(...)             (makespan, per rank [(op, start, end)]) by the statement's rules, in fractions
    canonical(p, m, v)        the statement's order (Megatron-LM's interleaved 1F1B; 118's 1F1B when v = 1)
    render(rows)              one text line per rank: op lists, or timelines on a time axis; never raises
"""
from __future__ import annotations

from fractions import Fraction
from itertools import accumulate


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


def render(rows, unit=None) -> str:
    """One line per rank.  Op lists as they are; (op, start, end) rows on a time axis, one cell per ``unit``
    (the shortest op by default), '.' where the rank idles.  Anything else comes out as its repr."""
    try:
        timed = any(rows) and all(len(e) == 3 and not isinstance(e[0], str) for row in rows for e in row)
        lines = _on_time_axis(rows, unit) if timed else [" ".join(map(_label, row)) for row in rows]
        return "\n".join(f"rank {r} | {line}".rstrip() for r, line in enumerate(lines))
    except Exception:  # noqa: BLE001 -- a drawing must never take a test down
        text = repr(rows)
        return text if len(text) < 400 else text[:397] + "..."


def _label(op) -> str:
    return f"{op[0]}{op[1]}.{op[2]}"


def _on_time_axis(rows, unit) -> list:
    unit = unit or min(b - a for row in rows for _, a, b in row if b > a)
    width = 1 + max(len(_label(op)) for row in rows for op, _, _ in row)
    lines = []
    for row in rows:
        text, cell = "", 0
        for op, a, b in row:
            first = max(cell, round(a / unit))
            text += ".".ljust(width) * (first - cell)
            cell = max(first + 1, round(b / unit))
            text += _label(op).ljust(width * (cell - first))
        lines.append(text)
    return lines
