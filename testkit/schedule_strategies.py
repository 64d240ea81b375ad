"""Hypothesis strategies for pipeline schedules and pipeline runs (problems 118, 122 and 130).

    sizes()                               (p, m): stages and micro-batches
    durations()                           an op's length, exact in binary
    schedules_that_finish(needs, p, m, split_w=False)   a random schedule that can finish under the rules
    in_groups(cases)                      (world, pp, case): pipelines of pp consecutive ranks in a larger world

``needs(s, op, p)``: the ``(stage, op, crosses a link)`` that must end before ``op`` starts on stage s (see
``testkit.pipelines``).
"""
from __future__ import annotations

from hypothesis import strategies as st


def sizes():
    """(p, m): 1-6 stages, 1-10 micro-batches; m < p, m = p and m > p all come up."""
    return st.tuples(st.integers(1, 6), st.integers(1, 10))


def durations():
    """0.25 .. 10 in quarters: exact in binary, so every expected time is exact too."""
    return st.integers(1, 40).map(lambda k: k / 4)


@st.composite
def schedules_that_finish(draw, needs, p: int, m: int, split_w: bool = False):
    """A random schedule that can finish: forwards in micro-batch order, backwards (B) in one order shared by
    every stage, and with ``split_w`` each W anywhere after its own B.  Built by running one random runnable op
    at a time, so every interleaving can appear."""
    b_order = draw(st.permutations(range(m)))
    rows, done = [[] for _ in range(p)], set()
    nf, nb, w_ready = [0] * p, [0] * p, [[] for _ in range(p)]
    while any(len(row) < (3 if split_w else 2) * m for row in rows):
        runnable = []
        for s in range(p):
            if nf[s] < m and all((d, o) in done for d, o, _ in needs(s, ("F", nf[s]), p)):
                runnable.append((s, ("F", nf[s])))
            if nb[s] < m and all((d, o) in done for d, o, _ in needs(s, ("B", b_order[nb[s]]), p)):
                runnable.append((s, ("B", b_order[nb[s]])))
            runnable += [(s, ("W", i)) for i in w_ready[s]]
        s, op = runnable[draw(st.integers(0, len(runnable) - 1))]
        rows[s].append(op)
        done.add((s, op))
        if op[0] == "F":
            nf[s] += 1
        elif op[0] == "B":
            nb[s] += 1
            if split_w:
                w_ready[s].append(op[1])
        else:
            w_ready[s].remove(op[1])
    return rows


@st.composite
def in_groups(draw, cases):
    """``cases(p=pp)``: the problem's run cases for pipelines of pp stages; a world of 4 in pipelines of 2, or a
    world of 2 or 4 in pipelines of 1."""
    world, pp = draw(st.sampled_from([(4, 2), (2, 1), (4, 1)]))
    return world, pp, draw(cases(p=pp))
