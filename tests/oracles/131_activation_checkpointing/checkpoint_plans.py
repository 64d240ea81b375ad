"""Problem 131's oracle: the statement's memory and FLOPs model of a checkpointing plan, and its optimum.

A plan is a list of segments ``(start, stop, recompute)`` covering units 0 .. L-1 in order.  With ``s[u]``
the bytes unit u saves for backward when it runs with autograd (its input included), ``a[u]`` the bytes of
its input (``a[0] = 0``: the batch is the caller's) and ``f[u]`` its forward FLOPs:

* held(i): what the segments before unit i keep: ``s[u]`` for each kept unit, ``a[start]`` for each
  recomputed segment;
* the peak: the largest of held(L) (the end of the forward) and, for each recomputed segment [i, j),
  held(i) + s[i] + ... + s[j-1] (its recompute, in backward, with everything before it still held);
* the recompute FLOPs: f[u] summed over the units of recomputed segments.

``least_flops`` and ``least_peak`` are dynamic programmes over (unit i, held(i)), written for this test
process; ``every_plan`` enumerates all plans, for small chains.
"""
from __future__ import annotations

import itertools


def check_plan(plan, n):
    """None if ``plan`` is a valid plan of n units, else what is wrong with it, in words."""
    if not isinstance(plan, list):
        return f"a plan is a list of (start, stop, recompute) tuples, not {type(plan).__name__}"
    at = 0
    for k, seg in enumerate(plan):
        if not (isinstance(seg, tuple) and len(seg) == 3 and all(isinstance(v, int) for v in seg)):
            return f"segment {k} is {seg!r}, not a tuple (start, stop, recompute) of int, int, bool"
        start, stop, _ = seg
        if start != at:
            return f"segment {k} {seg} starts at {start}, but the previous one ended at {at}"
        if stop <= start:
            return f"segment {k} {seg} is empty (stop <= start)"
        at = stop
    if at != n:
        return f"the segments end at unit {at}, but the chain has {n} units"
    return None


def held_before(plan, s, a):
    """held(start) of each segment, in order, and held(L)."""
    held, out = 0, []
    for start, stop, recompute in plan:
        out.append(held)
        held += a[start] if recompute else sum(s[start:stop])
    return out, held


def peak_bytes(plan, s, a):
    before, end = held_before(plan, s, a)
    peak = end
    for held, (start, stop, recompute) in zip(before, plan):
        if recompute:
            peak = max(peak, held + sum(s[start:stop]))
    return peak


def recompute_flops(plan, f):
    return sum(sum(f[start:stop]) for start, stop, recompute in plan if recompute)


def _segments(n):
    """For each unit i, the segments that may start there: (stop, recompute)."""
    return [[(i + 1, False)] + [(j, True) for j in range(i + 1, n + 1)] for i in range(n)]


def least_flops(s, a, f, budget):
    """The least recompute FLOPs of any plan whose peak is at most ``budget``; None if no plan fits."""
    n = len(s)
    table = [dict() for _ in range(n + 1)]   # held(i) -> least FLOPs so far
    table[0][0] = 0
    for i in range(n):
        for held, flops in table[i].items():
            for stop, recompute in _segments(n)[i]:
                if recompute:
                    if held + sum(s[i:stop]) > budget:
                        continue
                    nxt, cost = held + a[i], flops + sum(f[i:stop])
                else:
                    nxt, cost = held + s[i], flops
                if nxt <= budget and cost < table[stop].get(nxt, float("inf")):
                    table[stop][nxt] = cost
    return min(table[n].values()) if table[n] else None


def least_peak(s, a):
    """The smallest peak any plan reaches."""
    n = len(s)
    table = [dict() for _ in range(n + 1)]   # held(i) -> the least largest recompute peak so far
    table[0][0] = 0
    for i in range(n):
        for held, worst in table[i].items():
            for stop, recompute in _segments(n)[i]:
                if recompute:
                    nxt, peak = held + a[i], max(worst, held + sum(s[i:stop]))
                else:
                    nxt, peak = held + s[i], worst
                if peak < table[stop].get(nxt, float("inf")):
                    table[stop][nxt] = peak
    return min(max(held, worst) for held, worst in table[n].items())


def every_plan(n):
    """Every plan of n units: each unit kept or recomputed, and each cut between two recomputed units made
    or not (cuts between kept units change nothing, so kept units come one segment each)."""
    for kinds in itertools.product((False, True), repeat=n):
        cuts = [i for i in range(1, n) if kinds[i] and kinds[i - 1]]
        for chosen in itertools.product((False, True), repeat=len(cuts)):
            cut = {i for i, c in zip(cuts, chosen) if c}
            plan, start = [], 0
            for i in range(1, n + 1):
                if i == n or not kinds[i] or not kinds[i - 1] or i in cut:
                    plan.append((start, i, kinds[start]))
                    start = i
            yield plan
