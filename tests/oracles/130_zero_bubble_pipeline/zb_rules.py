"""Problem 130's rules, written out once for its tests (they run in the test process, never on the ranks).

An op is ``(kind, micro-batch)`` with kind "F" (forward), "B" (input gradient) or "W" (weight gradient).

    needs(s, op, p)           the (stage, op, crosses a link) that must end before ``op`` starts on stage s
    replay(schedule)          the ops in an order that respects ``needs``, and each stage's op that can never run
    timeline(...)             (makespan, per stage [(op, start, end)]) by the statement's rules, in fractions
    zb_h1(p, m)               the statement's ZB-H1 order
    one_f_one_b(p, m)         118's 1F1B with the backward split, W right after its B
    fused_1f1b(p, m)          118's 1F1B as it is: one B op per micro-batch, the whole backward
    in_flight_peak(ops)       the most micro-batches forwarded and not yet weight-gradiented (+1 at F, -1 at W)
    zb_makespan(...)          the closed form of ZB-H1's makespan
    torch_zb_order(p, m)      torch.distributed.pipelining's ScheduleInterleavedZeroBubble with one stage per
                              rank, as op lists of this problem (None where torch has no such schedule)
    render(rows, unit=None)   one text line per stage: op lists, or timelines on a time axis; never raises
    both(got, want)           the learner's op lists (or timeline) and the expected ones, one under the other
"""
from __future__ import annotations

from fractions import Fraction

from testkit import pipelines
from testkit.schedule_drawing import ScheduleText


def needs(s: int, op, p: int) -> list:
    kind, i = op
    if kind == "F":
        return [(s - 1, ("F", i), True)] if s > 0 else []
    if kind == "B":
        return [(s, ("F", i), False)] + ([(s + 1, ("B", i), True)] if s < p - 1 else [])
    return [(s, ("B", i), False)]


def replay(schedule):
    """Run ops while any stage's next op has all it needs: (order, [(stage, its stuck op)])."""
    return pipelines.replay(schedule, needs)


def timeline(schedule, tf, tb, tw, t_comm=0):
    """Every op starts when its stage is free and what it needs has ended (+ t_comm across a link).
    Exact (fractions).  None when the schedule can never finish."""
    order, stuck = replay(schedule)
    if stuck:
        return None
    p = len(schedule)
    cost = {"F": Fraction(tf), "B": Fraction(tb), "W": Fraction(tw)}
    free, end, rows = [Fraction(0)] * p, {}, [[] for _ in range(p)]
    for s, op in order:
        start = max([free[s]] + [end[(d, o)] + (Fraction(t_comm) if link else 0) for d, o, link in needs(s, op, p)])
        end[(s, op)] = free[s] = start + cost[op[0]]
        rows[s].append((op, start, free[s]))
    return max(free, default=Fraction(0)), rows


def zb_h1(p: int, m: int) -> list:
    """Stage s: w = min(p - s - 1, m) warm-up forwards; then for k = 0 .. m-1: F(k + w) while any is left, B(k),
    and W(k - s) once k >= s; then the s deferred W's."""
    rows = []
    for s in range(p):
        w = min(p - s - 1, m)
        row = [("F", i) for i in range(w)]
        for k in range(m):
            row += [("F", k + w)] * (k + w < m) + [("B", k)] + [("W", k - s)] * (k >= s)
        rows.append(row + [("W", i) for i in range(max(m - s, 0), m)])
    return rows


def one_f_one_b(p: int, m: int) -> list:
    rows = []
    for s in range(p):
        w = min(p - s - 1, m)
        row = [("F", i) for i in range(w)]
        for k in range(m):
            row += [("F", k + w)] * (k + w < m) + [("B", k), ("W", k)]
        rows.append(row)
    return rows


def fused_1f1b(p: int, m: int) -> list:
    return [[op for op in row if op[0] != "W"] for row in one_f_one_b(p, m)]


def in_flight_peak(ops) -> int:
    live = peak = 0
    for kind, _ in ops:
        live += (kind == "F") - (kind == "W")
        peak = max(peak, live)
    return peak


def zb_makespan(p: int, m: int, tf, tb, tw) -> Fraction:
    tf, tb, tw = Fraction(tf), Fraction(tb), Fraction(tw)
    return m * (tf + tb + tw) + (p - 1) * (tf + tb) - (min(m, p) - 1) * min(tf, tb, tw)


def torch_zb_order(p: int, m: int):
    """torch's ZB1P (ScheduleInterleavedZeroBubble) with one stage per rank: its pipeline_order without the idle
    slots (None), "I" (backward input) as "B", each rank's stage index dropped.  None where torch refuses the
    configuration (m not a multiple of its number of rounds, max(1, m // p)) or has no such schedule."""
    import logging
    from types import SimpleNamespace
    try:
        from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble
    except ImportError:
        return None
    stage = SimpleNamespace(group_size=p, group_rank=0, num_stages=p, stage_index=0, submod=None,
                            is_first=True, is_last=p == 1)
    log = logging.getLogger("torch.distributed.pipelining.schedules")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        order = ScheduleInterleavedZeroBubble([stage], m).pipeline_order
    except ValueError:
        return None
    finally:
        log.setLevel(level)
    kind = {"F": "F", "I": "B", "W": "W"}
    return [[(kind[a.computation_type.value], a.microbatch_index) for a in order[r] if a is not None]
            for r in range(p)]


def _label(op) -> str:
    return f"{op[0]}{op[1]}"


_TEXT = ScheduleText("stage", _label)
render, both = _TEXT.render, _TEXT.both
