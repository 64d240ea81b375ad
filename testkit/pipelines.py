"""A pipeline schedule's simulation checked against the rules, in the test process (problems 118, 122, 130).

An op is ``(kind, micro-batch)``: "F" forward, "B" backward (in 130 the input gradient), "W" weight gradient
(130).  A schedule is one op list per stage.  The rules are the caller's: ``needs(s, op, p)`` lists the
``(stage, op, crosses a link)`` that must end before ``op`` starts on stage s, as the problem's oracle (or its
tests) writes them out.

    replay(schedule, needs)               the ops in an order the rules allow, and the ops that can never run
    close(a, b)                           a float from the learner's code against the expected value
    simulated(target, schedule, *times)   the learner's ``simulate(schedule, *times)`` on one rank, as plain data
    plain_events(events)                  a timeline ((op, start, end) per stage) as plain tuples and floats
    finished(out, call, why)              ``out`` did not raise ScheduleDeadlock, for a schedule that finishes
    check_timeline(...)                   each op of ``out``'s timeline starts, lasts and ends as the rules say
    check_deadlock(...)                   ScheduleDeadlock raised exactly when the schedule can never finish

The problem's words for a failure, where its tests say it their own way, are the caller's too.  The strategies
that draw schedules are ``testkit.schedule_strategies``; nothing here imports hypothesis, since the ranks load
this module for ``simulated``.
"""
from __future__ import annotations

import math

import harness


def replay(schedule, needs):
    """Runs ops while any stage's next op has all it needs: (the ops in the order run, as (stage, op), and
    [(stage, its next op)] for every stage that can go no further: empty when the schedule finishes)."""
    rows = [[tuple(op) for op in ops] for ops in schedule]
    p, heads, done, order = len(rows), [0] * len(rows), set(), []
    progress = True
    while progress:
        progress = False
        for s, ops in enumerate(rows):
            while heads[s] < len(ops) and all((d, o) in done for d, o, _ in needs(s, ops[heads[s]], p)):
                order.append((s, ops[heads[s]]))
                done.add((s, ops[heads[s]]))
                heads[s] += 1
                progress = True
    return order, [(s, ops[heads[s]]) for s, ops in enumerate(rows) if heads[s] < len(ops)]


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def plain_events(events) -> list:
    return [[((str(op[0]), int(op[1])), float(a), float(b)) for op, a, b in stage] for stage in events]


def _simulate(target, schedule, times):
    mod = target.load()
    try:
        result = mod.simulate(schedule, *times)
    except Exception as e:  # noqa: BLE001 -- only ScheduleDeadlock is data; anything else is the learner's error
        if isinstance(mod.ScheduleDeadlock, type) and isinstance(e, mod.ScheduleDeadlock):
            return {"deadlock": str(e)}
        raise
    return {"makespan": float(result.makespan), "bubble_ratio": float(result.bubble_ratio),
            "events": plain_events(result.events), "peak_activations": [int(k) for k in result.peak_activations]}


def simulated(target, schedule, *times) -> dict:
    """{"deadlock": its message} where it raised ScheduleDeadlock, else the result's makespan, bubble_ratio,
    events and peak_activations; any other exception is the learner's error, and fails the test as one."""
    return harness.run(_simulate, 1, target, schedule, times).values[0]


def finished(out, call: str, why: str):
    """``out`` (``simulated``'s) for a schedule that can finish; ``why``: the failure's words for that."""
    harness.check("deadlock" not in out, f"{call} raised ScheduleDeadlock({out.get('deadlock')!r}), but {why}")
    return out


def check_timeline(out, schedule, needs, lengths: dict, t_comm, here: str, listed: str, starts: str):
    """``out`` (``simulated``'s, finished) against the rules: per stage, (op, start, end) for its ops in list
    order, each op starting exactly when its stage is free and what it needs has ended (+ t_comm across a link),
    lasting ``lengths[kind]``; the makespan when the last op ends; bubble_ratio idle / (stages x makespan).
    ``here`` heads every failure; ``listed`` names the ops of a stage ("the ops"), ``starts`` says when an op
    starts, a format of ``ready`` ("... are done at {ready:g}, so it must start exactly then")."""
    p, events = len(schedule), out["events"]
    harness.check(len(events) == p and all([e[0] for e in events[s]] == schedule[s] for s in range(p)),
                  f"{here}\n.events must list, per stage, (op, start, end) for {listed} in list order")
    end = {(s, op): b for s in range(p) for op, _, b in events[s]}
    busy = 0.0
    for s in range(p):
        free = 0.0
        for op, start, stop in events[s]:
            ready = max([free] + [end[(d, o)] + (t_comm if link else 0.0) for d, o, link in needs(s, op, p)])
            harness.check(close(start, ready), f"{here}\nstage {s}: {op} starts at {start:g}; the stage is free and "
                                               + starts.format(ready=ready))
            length = lengths[op[0]]
            harness.check(close(stop - start, length), f"{here}\nstage {s}: {op} lasts {stop - start:g}, expected "
                                                       f"{length:g}")
            free, busy = stop, busy + stop - start
    makespan = max(b for stage in events for _, _, b in stage)
    harness.check(close(out["makespan"], makespan), f"{here}\nmakespan is {out['makespan']:g}; the last op ends at "
                                                    f"{makespan:g}")
    bubble = (p * makespan - busy) / (p * makespan)
    harness.check(close(out["bubble_ratio"], bubble), f"{here}\nbubble_ratio is {out['bubble_ratio']:g}; idle / "
                                                      f"(stages x makespan) = {bubble:g}")


def check_deadlock(out, schedule, needs, why: str, drawing: str, stuck_as: str, named_as: str):
    """``out`` (``simulated``'s) raised ScheduleDeadlock exactly when the schedule can never finish, its message
    naming a stuck op as "stage s: (kind, i)".  ``why``: as for ``finished``; ``drawing`` ends every failure;
    ``stuck_as`` says the schedule is stuck, a format of ``named`` (the stuck ops); ``named_as``: the form the
    message must use."""
    _, stuck = replay(schedule, needs)
    if not stuck:
        finished(out, "simulate", why)
        return
    named = [f"stage {s}: {op!r}" for s, op in stuck]
    harness.check("deadlock" in out, f"simulate returned makespan {out.get('makespan')} for a schedule that "
                                     f"{stuck_as.format(named=', '.join(named))}; it must raise ScheduleDeadlock:"
                                     f"{drawing}")
    harness.check(any(n in out["deadlock"] for n in named),
                  f"ScheduleDeadlock({out['deadlock']!r}) must name a stuck op as {named_as}, one of: "
                  f"{', '.join(named)}:{drawing}")
