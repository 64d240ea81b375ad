"""Problem 122 properties.  Each test is one line of the statement's list ("What the tests check").

Learner code runs only on the ranks (``harness.run``; the pure functions on one rank).  The statement's
rules (virtual stages, the canonical order, timing any schedule) live in ``virtual_stages.py``, an oracle in
tests/oracles/ (conftest.py imports it), and run here, in the test process, in exact fractions; what the real
run sent comes from the harness's trace, and which activations it kept alive from ``harness.saved_for_backward``
around each chunk forward (``ActivationWatch``).  Each rank receives only its own chunks and what its role needs
(``harness.per_rank``).
"""
import contextlib
import gc
import math
from fractions import Fraction

import torch
from hypothesis import given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.groups import contiguous_groups, group_layout, positions
from testkit.models import mse, random_mlp
from testkit.pipeline_runs import (against_the_truth, check_loss, full_batch_step, listed, run_pipelines,
                                   stage_widths)
from testkit.pipeline_cost import SendCost, check_sends, figure_pairs
from testkit.pipelines import close
from testkit.schedule_drawing import record_drawing
from testkit.schedule_strategies import durations, in_groups

# this folder's own helper (conftest.py makes it importable by name)
from virtual_stages import both, canonical, needs, peak_in_flight, render, replay, timeline, warmup

torch.set_num_threads(1)   # the expected values are tiny: one thread is fastest beside the ranks

SCHEDULE_TYPE = "list[list[tuple[str, int, int]]]"


# ---- strategies ---------------------------------------------------------------------------------------

@st.composite
def pmv(draw, max_p=5, max_v=4, max_groups=3):
    """(p, m, v): p >= 3 and v >= 2 at least half the time each, p = 1 and v = 1 among the rest; m = p or
    a larger multiple of p."""
    p = draw(st.one_of(st.integers(3, max_p), st.integers(1, max_p)))
    v = draw(st.one_of(st.integers(2, max_v), st.integers(1, max_v)))
    return p, p * draw(st.integers(1, max_groups)), v


@st.composite
def times(draw):
    """(tf, tb): equal half the time, as the bubble formula is usually quoted."""
    tf = draw(durations())
    return tf, draw(st.one_of(st.just(tf), durations()))


def every_op(m, v):
    return [(kind, i, c) for kind in "FB" for i in range(m) for c in range(v)]


@st.composite
def feasible_schedules(draw):
    """(schedule, p, v): any schedule that can finish, built by running one random runnable op at a time."""
    p, v, m = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    todo, done, rows = [every_op(m, v) for _ in range(p)], set(), [[] for _ in range(p)]
    while any(todo):
        runnable = [(r, op) for r in range(p) for op in todo[r] if all(n in done for n in needs(r, op, p, v))]
        r, op = runnable[draw(st.integers(0, len(runnable) - 1))]
        todo[r].remove(op)
        rows[r].append(op)
        done.add((r, op))
    return rows, p, v


@st.composite
def shuffled_schedules(draw):
    """(schedule, p, v): each rank's ops in any order; mostly schedules that can never finish."""
    p, v, m = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    return [list(draw(st.permutations(every_op(m, v)))) for _ in range(p)], p, v


# ---- the pure functions, each run on one rank ----------------------------------------------------------

def _schedule(target, p, m, v):
    try:
        return {"schedule": target.load().interleaved_schedule(p, m, v)}
    except ValueError as e:
        return {"ValueError": str(e)}


def schedule_of(target, p, m, v):
    """The learner's interleaved_schedule(p, m, v), checked for its type and its p op lists."""
    call = f"interleaved_schedule({p}, {m}, {v})"
    out = harness.run(_schedule, 1, target, p, m, v, reuse=True).values[0]
    harness.check("schedule" in out, f"{call} raised ValueError({out.get('ValueError')!r}), but m = {m} is a "
                                     f"multiple of p = {p}")
    got = harness.expect_type(out["schedule"], SCHEDULE_TYPE, call)
    harness.check(len(got) == p, f"{call} returned {len(got)} op lists; there is one per rank, p = {p}")
    return got


def _simulate(target, schedule, p, v, tf, tb):
    mod = target.load()
    try:
        return {"result": mod.simulate(schedule, p, v, tf, tb)}
    except Exception as e:  # noqa: BLE001 -- only ScheduleDeadlock is data; anything else is the learner's error
        if isinstance(mod.ScheduleDeadlock, type) and isinstance(e, mod.ScheduleDeadlock):
            return {"deadlock": str(e)}
        raise


def simulated(target, schedule, p, v, tf, tb, call):
    """The learner's simulate(...): {'deadlock': message} or (makespan, busy), checked for its type."""
    out = harness.run(_simulate, 1, target, schedule, p, v, tf, tb).values[0]
    if "deadlock" in out:
        return out
    return harness.expect_type(out["result"], "tuple[float, list[list[tuple[tuple[str, int, int], float, float]]]]",
                               call)


def feasible(out, call, schedule):
    """simulate's (makespan, busy) for a schedule that finishes; a ScheduleDeadlock there fails."""
    if isinstance(out, dict):
        raise harness.PropertyFailed(f"{call} raised ScheduleDeadlock({out['deadlock']!r}) for a schedule that "
                                     f"finishes:\n{render(schedule)}")
    return out


# ---- the statement's examples (and the drawing judge.py --show prints) -----------------------------------

EXAMPLE = [
    [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 0), ("B", 0, 1), ("F", 3, 0), ("B", 1, 1),
     ("F", 2, 1), ("B", 0, 0), ("F", 3, 1), ("B", 1, 0), ("B", 2, 1), ("B", 3, 1), ("B", 2, 0), ("B", 3, 0)],
    [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1), ("F", 1, 1), ("B", 1, 1), ("F", 2, 0), ("B", 0, 0),
     ("F", 3, 0), ("B", 1, 0), ("F", 2, 1), ("B", 2, 1), ("F", 3, 1), ("B", 3, 1), ("B", 2, 0), ("B", 3, 0)],
]
STUCK = [[("F", 0, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1)]]   # p = 1, v = 2: B(0, 0) waits for B(0, 1)


def _drawing(target):
    mod = target.load()
    text = "interleaved_schedule(2, 4, 2), your op lists (F2.1: forward of micro-batch 2 on chunk 1):\n"
    try:
        schedule = mod.interleaved_schedule(2, 4, 2)
        text += render(schedule)
        _, busy = mod.simulate(schedule, 2, 2, 2.0, 2.0)
        return text + "\n\nyour simulate(that, p=2, v=2, tf=2, tb=2), one cell = 1:\n" + render(busy, 1.0)
    except Exception as e:  # noqa: BLE001 -- the drawing only says what happened; the tests judge it
        return text + f"\n({type(e).__name__}: {e})"


def test_statement_examples(target, record_property):
    """The statement's worked examples, exactly."""
    record_drawing(record_property, lambda: harness.run(_drawing, 1, target).values[0])
    got = schedule_of(target, 2, 4, 2)
    harness.check(got == EXAMPLE, f"interleaved_schedule(2, 4, 2) differs from the statement's example:"
                                  f"{both(got, EXAMPLE)}")
    for tf, tb, makespan in ((2.0, 2.0, 18.0), (1.0, 2.0, 13.5)):
        call = f"simulate(interleaved_schedule(2, 4, 2), p=2, v=2, tf={tf:g}, tb={tb:g})"
        out = feasible(simulated(target, EXAMPLE, 2, 2, tf, tb, call), call, EXAMPLE)
        harness.check(close(out[0], makespan), f"{call} returned makespan {out[0]:g}; the statement's example "
                                               f"says {makespan:g}:\n{render(out[1])}")
    out = simulated(target, STUCK, 1, 2, 1.0, 1.0, "simulate")
    harness.check(isinstance(out, dict) and "rank 0: ('B', 0, 0)" in out["deadlock"],
                  f"simulate({STUCK}, p=1, v=2, ...) must raise ScheduleDeadlock naming rank 0: ('B', 0, 0); "
                  f"it gave {out!r}")


# ---- interleaved_schedule --------------------------------------------------------------------------------

@given(pmv())
def test_every_op_once_forward_before_backward(target, case):
    """Every (micro-batch, chunk) runs F, then B, exactly once on every rank."""
    p, m, v = case
    got = schedule_of(target, p, m, v)
    for r, ops in enumerate(got):
        where = f"interleaved_schedule({p}, {m}, {v}), rank {r}"
        harness.check(sorted(ops) == sorted(every_op(m, v)),
                      f"{where} must run each ('F' | 'B', micro-batch 0..{m - 1}, chunk 0..{v - 1}) exactly "
                      f"once:\n{render(got)}")
        late = [f"('B', {i}, {c})" for i in range(m) for c in range(v)
                if ops.index(("B", i, c)) < ops.index(("F", i, c))]
        harness.check(not late, f"{where} runs {', '.join(late[:3])} before its forward:\n{render(got)}")


@given(pmv())
def test_dependencies_hold_across_virtual_stages(target, case):
    """Replayed by the statement's rules, the schedule finishes: no op waits for one that comes after it."""
    p, m, v = case
    got = schedule_of(target, p, m, v)
    _, stuck = replay(got, p, v)
    waits = [f"rank {r}: {op} (it needs {', '.join(f'{o} on rank {q}' for q, o in needs(r, op, p, v))})"
             for r, op in stuck]
    harness.check(not stuck, f"interleaved_schedule({p}, {m}, {v}) can never finish; stuck: {'; '.join(waits)}. "
                             f"Chunk c of rank r is virtual stage r + c*p: a B waits for the B of the next "
                             f"virtual stage, an F for the F of the previous one:\n{render(got)}")


@given(pmv())
def test_canonical_order(target, case):
    """The order is the statement's: Megatron's warm-up count, then one F one B, then the cool-down."""
    p, m, v = case
    got, want = schedule_of(target, p, m, v), canonical(p, m, v)
    for r, ops in enumerate(got):
        w = warmup(p, m, v, r)
        before = next((k for k, op in enumerate(ops) if op[0] == "B"), len(ops))
        rule = "min(p - r - 1, m) (1F1B)" if v == 1 else "min(2(p - r - 1) + (v - 1)p, m*v)"
        harness.check(before == min(w + 1, m * v),
                      f"interleaved_schedule({p}, {m}, {v}): rank {r} runs {before} forwards before its first "
                      f"backward, expected {min(w + 1, m * v)}: the warm-up is {rule} = {w}, then the steady "
                      f"state opens with one more forward if any is left:{both(got, want)}")
    harness.check(got == want, f"interleaved_schedule({p}, {m}, {v}) is not the statement's order (micro-batches "
                               f"in groups of p, forwards chunk 0 first, backwards chunk v - 1 first):"
                               f"{both(got, want)}")


@given(st.integers(1, 5), st.integers(1, 3))
def test_v1_is_118s_1f1b(target, p, groups):
    """v = 1 is problem 118's 1F1B schedule, each op on chunk 0."""
    m = p * groups
    want = []
    for r in range(p):
        w = min(p - r - 1, m)
        pairs = [op for i in range(m - w) for op in (("F", w + i, 0), ("B", i, 0))]
        want.append([("F", i, 0) for i in range(w)] + pairs + [("B", i, 0) for i in range(m - w, m)])
    got = schedule_of(target, p, m, 1)
    harness.check(got == want, f"interleaved_schedule({p}, {m}, 1) must be 118's 1F1B (warm-up min(p - r - 1, m), "
                               f"then F(w + i) B(i), then the remaining backwards), on chunk 0:{both(got, want)}")


@given(st.integers(2, 6).flatmap(lambda p: st.tuples(st.just(p), st.integers(1, 4 * p).filter(lambda m: m % p),
                                                     st.integers(1, 4))))
def test_m_not_multiple_of_p_raises(target, case):
    """m not a multiple of p raises ValueError."""
    p, m, v = case
    out = harness.run(_schedule, 1, target, p, m, v).values[0]
    harness.check("ValueError" in out, f"interleaved_schedule({p}, {m}, {v}) returned a schedule; m = {m} is not a "
                                       f"multiple of p = {p}, so it must raise ValueError")


# ---- simulate ------------------------------------------------------------------------------------------

@given(feasible_schedules(), durations(), durations())
def test_simulate_follows_the_dependencies(target, drawn, tf, tb):
    """Every op starts exactly when its rank is free and what it needs (across virtual stages) has ended;
    F lasts tf/v, B tb/v; the makespan is when the last op ends."""
    schedule, p, v = drawn
    call = f"simulate(schedule, p={p}, v={v}, tf={tf:g}, tb={tb:g})"
    makespan, busy = feasible(simulated(target, schedule, p, v, tf, tb, call), call, schedule)
    here = f"{call}, schedule:\n{render(schedule)}\nyour busy intervals:\n{render(busy)}"
    harness.check(len(busy) == p and all([e[0] for e in busy[r]] == schedule[r] for r in range(p)),
                  f"{here}\nthe intervals must list, per rank, (op, start, end) for its ops in list order")
    end = {(r, op): b for r in range(p) for op, _, b in busy[r]}
    for r in range(p):
        free = 0.0
        for op, start, stop in busy[r]:
            ready = max([free] + [end[n] for n in needs(r, op, p, v)])
            harness.check(close(start, ready), f"{here}\nrank {r}: {op} starts at {start:g}; its rank is free and "
                                               f"what it needs has ended at {ready:g} (chunk c of rank r is stage "
                                               f"r + c*p), so it starts exactly then")
            length = (tf if op[0] == "F" else tb) / v
            harness.check(close(stop - start, length), f"{here}\nrank {r}: {op} lasts {stop - start:g}; a chunk's "
                                                       f"{op[0]} lasts {'tf' if op[0] == 'F' else 'tb'}/v = {length:g}")
            free = stop
    last = max(b for row in busy for _, _, b in row)
    harness.check(close(makespan, last), f"{here}\nmakespan is {makespan:g}; the last op ends at {last:g}")


@given(st.one_of(shuffled_schedules(), feasible_schedules()), durations())
def test_deadlocks_are_detected(target, drawn, tf):
    """simulate raises ScheduleDeadlock exactly when the schedule can never finish, naming a stuck op."""
    schedule, p, v = drawn
    out = simulated(target, schedule, p, v, tf, tf, "simulate")
    _, stuck = replay(schedule, p, v)
    if not stuck:
        feasible(out, f"simulate(schedule, p={p}, v={v})", schedule)
        return
    named = [f"rank {r}: {op!r}" for r, op in stuck]
    if not isinstance(out, dict):
        raise harness.PropertyFailed(f"simulate(schedule, p={p}, v={v}) returned makespan {out[0]} for a schedule "
                                     f"that can never finish ({', '.join(named)} wait forever); it must raise "
                                     f"ScheduleDeadlock:\n{render(schedule)}")
    harness.check(any(n in out["deadlock"] for n in named),
                  f"ScheduleDeadlock({out['deadlock']!r}) must name a stuck op as \"rank r: ('B', i, c)\", one "
                  f"of: {', '.join(named)}:\n{render(schedule)}")


# ---- what the schedule buys ------------------------------------------------------------------------------

@given(pmv(), times())
def test_makespan_and_bubble(target, record_property, case, tf_tb):
    """(m + (p - 1)/v)(tf + tb) and bubble (p - 1)/(v*m + p - 1): the schedule timed by the statement's
    rules, and simulate on the statement's schedule."""
    (p, m, v), (tf, tb) = case, tf_tb
    want = (m + Fraction(p - 1, v)) * (Fraction(tf) + Fraction(tb))
    got = schedule_of(target, p, m, v)
    timed = timeline(got, p, v, tf, tb)
    harness.check(timed is not None, f"interleaved_schedule({p}, {m}, {v}) can never finish:\n{render(got)}")
    makespan, rows = timed
    bubble = 1 - Fraction(m) * (Fraction(tf) + Fraction(tb)) / makespan
    harness.check(bubble == Fraction(p - 1, v * m + p - 1),
                  f"interleaved_schedule({p}, {m}, {v}) timed by the statement's rules (tf={tf:g}, tb={tb:g}) takes "
                  f"{float(makespan):g}, bubble fraction {float(bubble):.4g}; expected (m + (p - 1)/v)(tf + tb) = "
                  f"{float(want):g}, the cost model's bubble fraction (p − 1)/(v·m + p − 1) = "
                  f"{p - 1}/{v * m + p - 1}:\n{render(rows, Fraction(min(tf, tb)) / v)}")
    cost.record(record_property, f"interleaved_schedule({p}, {m}, {v}), tf={tf:g}, tb={tb:g}", p * m * v,
                bubble_fraction=(float(Fraction(p - 1, v * m + p - 1)), float(bubble)))
    call = f"simulate(the statement's schedule for p={p}, m={m}, v={v}, tf={tf:g}, tb={tb:g})"
    want_rows = canonical(p, m, v)
    out = feasible(simulated(target, want_rows, p, v, tf, tb, call), call, want_rows)
    harness.check(close(out[0], float(want)), f"{call} returned makespan {out[0]:g}; expected "
                                              f"(m + (p - 1)/v)(tf + tb) = {float(want):g}")


@given(pmv())
def test_peak_activations_within_bound(target, case):
    """Rank r holds at most min(2(p - r - 1) + (v - 1)p + 1, m*v) chunk activations (v = 1: min(p - r, m))."""
    p, m, v = case
    got = schedule_of(target, p, m, v)
    peaks = [peak_in_flight(ops) for ops in got]
    bounds = [min(warmup(p, m, v, r) + 1, m * v) for r in range(p)]
    over = [f"rank {r} holds {peaks[r]} (bound {bounds[r]})" for r in range(p) if peaks[r] > bounds[r]]
    harness.check(not over, f"interleaved_schedule({p}, {m}, {v}): {'; '.join(over)} chunk activations at once "
                            f"(forwarded, not yet backwarded); the bound is min(warm-up + 1, m*v):\n{render(got)}")


@given(pmv(), durations(), durations())
def test_never_slower_than_1f1b(target, case, tf, tb):
    """Timed by the statement's rules, the interleaved schedule never takes longer than 118's 1F1B on the
    same model (one stage of cost tf, tb per rank)."""
    p, m, v = case
    got = schedule_of(target, p, m, v)
    timed, base = timeline(got, p, v, tf, tb), timeline(canonical(p, m, 1), p, 1, tf, tb)
    harness.check(timed is not None, f"interleaved_schedule({p}, {m}, {v}) can never finish:\n{render(got)}")
    harness.check(timed[0] <= base[0], f"interleaved_schedule({p}, {m}, {v}) takes {float(timed[0]):g} with tf={tf:g}, "
                                       f"tb={tb:g}; 118's 1F1B takes {float(base[0]):g}:\n"
                                       f"{render(timed[1], Fraction(min(tf, tb)) / v)}")


# ---- run_interleaved on real ranks ----------------------------------------------------------------------

@st.composite
def run_cases(draw, p=None):
    """A real run: p ranks, v chunks each (p*v <= 8), m a multiple of p (m <= 8), tiny Linear-Tanh-Linear
    chunks; the statement's schedule, or one with more warm-up forwards (the run must follow the one given)."""
    p = p or draw(st.one_of(st.integers(3, 4), hs.world_sizes()))
    most = min(4, 8 // p)
    v = draw(st.one_of(st.integers(min(2, most), most), st.integers(1, most)))
    m = p * draw(st.integers(1, 8 // p))
    extra = draw(st.sampled_from([0, 0, 1, m * v]))
    widths = draw(st.lists(st.integers(1, 3), min_size=4, max_size=4))
    return dict(p=p, v=v, m=m, extra=extra, schedule=canonical(p, m, v, extra), rows=draw(st.integers(1, 2)),
                widths=widths, seed=draw(hs.seeds()), grads_before=draw(st.booleans()))


def chunk_widths(case, s):
    """Virtual stage s is Linear, Tanh, Linear: d_in -> h -> d on stage 0, d -> h -> d, ..., d -> h -> d_out."""
    return stage_widths(case["widths"], s, case["p"] * case["v"] - 1)


def chunk_module(case, s, pipeline=0):
    return random_mlp(chunk_widths(case, s), case["seed"] + 1009 * s + 65537 * pipeline)


def data(case, pipeline=0):
    d_in, _, _, d_out = case["widths"]
    gen = torch.Generator().manual_seed(case["seed"] + 11 + 65537 * pipeline)
    return [(torch.randn(case["rows"], d_in, generator=gen, dtype=torch.float64),
             torch.randn(case["rows"], d_out, generator=gen, dtype=torch.float64)) for _ in range(case["m"])]


def old_grads(case, module):
    """What .grad holds before the run: random when the case says so, else None."""
    gen = torch.Generator().manual_seed(case["seed"] + 5)
    return [torch.randn(q.shape, generator=gen, dtype=q.dtype) if case["grads_before"] else None
            for q in module.parameters()]


def rank_inputs(case, where):
    """Rank g = (pipeline, r) gets its v chunks (stages r + c*p: widths, weights, starting .grad), the
    schedule, and of the micro-batches only the inputs (rank 0) or only the targets (rank p - 1).  Tensors
    travel as lists: plain data pickles the same every time, so harness.run(reuse=True) knows a repeated call."""
    p, out = case["p"], []
    for g in range(len(where)):
        pipeline, r = where[g]
        chunks = []
        for s in range(r, p * case["v"], p):
            module = chunk_module(case, s, pipeline)
            chunks.append((chunk_widths(case, s), [listed(q) for q in module.parameters()],
                           [listed(q) for q in old_grads(case, module)]))
        batches = [(listed(x) if r == 0 else None, listed(y) if r == p - 1 else None) for x, y in data(case, pipeline)]
        out.append({"chunks": chunks, "schedule": case["schedule"],
                    "microbatches": batches if r in (0, p - 1) else None})
    return harness.per_rank(out)


def _tensor(values):
    return None if values is None else torch.tensor(values, dtype=torch.float64, device=harness.device())


def _chunk(widths, weights, grads):
    module = random_mlp(widths, 0)
    with torch.no_grad():
        for q, w, g in zip(module.parameters(), weights, grads):
            q.copy_(_tensor(w))
            q.grad = _tensor(g)
    return module


class ActivationWatch:
    """On a rank: at each chunk forward (once it has run) and each chunk backward (as it starts), which of the
    rank's earlier forwards still have activations alive: tensors autograd saved in that forward, parameters
    aside (``harness.saved_for_backward``).  ``events``: [kind, chunk, [alive forwards, numbered from 0]]."""

    def __init__(self, chunks):
        self.parameters = [q for chunk in chunks for q in chunk.parameters()]
        self.forwards, self.events = [], []
        for c, chunk in enumerate(chunks):
            chunk.forward = self._watched(c, chunk.forward)   # the same module, every call recorded

    def _watched(self, c, forward):
        def watched(*args, **kwargs):
            with harness.saved_for_backward() as saved:
                out = forward(*args, **kwargs)
            self.forwards.append(saved)
            self._note("F", c)
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(lambda grad: self._note("B", c))   # runs as this chunk's backward starts
            return out
        return watched

    def _alive(self):
        return [f for f, saved in enumerate(self.forwards) if saved.storages(exclude=self.parameters)]

    def _note(self, kind, c):
        alive = self._alive()
        in_flight = len(self.forwards) - sum(e[0] == "B" for e in self.events)
        if len(alive) > in_flight:   # a graph in a fresh reference cycle is garbage, not held (a full collection
            gc.collect(1)            # takes a third of a second with torch loaded: the young generations only)
            alive = self._alive()
        self.events.append([kind, c, alive])


def _interleaved(target, mine, act_shape, pp):
    """Runs on every rank: run_interleaved on this rank's chunks, watched (``ActivationWatch``); with ``pp``,
    inside its pipeline's group."""
    mod = target.load()
    chunks = [_chunk(*spec) for spec in mine["chunks"]]
    watch = ActivationWatch(chunks)
    batches = mine["microbatches"] and [(_tensor(x), _tensor(y)) for x, y in mine["microbatches"]]
    groups = contiguous_groups(pp) if pp else contextlib.nullcontext((None, None, None))
    with groups as (group, _, _), harness.phase("interleaved"):
        loss = mod.run_interleaved(chunks, mine["schedule"], batches, act_shape, mse, group=group)
    return {"loss": loss.detach().clone() if isinstance(loss, torch.Tensor) else loss,
            "grads": [[None if q.grad is None else q.grad.clone() for q in chunk.parameters()] for chunk in chunks],
            "activations": watch.events}


def run_on_ranks(target, case, world=None, pp=None):
    """One pipeline of p ranks; or, with ``pp``, ``world`` ranks as pipelines of pp consecutive ranks."""
    return run_pipelines(_interleaved, target, case, rank_inputs, world, pp)


def single_process(case, pipeline=0):
    """Every virtual stage in sequence on the whole batch, the mean loss, one backward: (loss, grads per stage)."""
    stages = [chunk_module(case, s, pipeline) for s in range(case["p"] * case["v"])]
    return full_batch_step(stages, lambda stage: old_grads(case, stage), *zip(*data(case, pipeline)))


def describe(case):
    flavour = f"{case['extra']} more warm-up forwards than the statement's" if case["extra"] else "the statement's"
    rows = f"{case['rows']} row" + "s" * (case["rows"] > 1)
    return (f"run_interleaved with p={case['p']}, v={case['v']}, m={case['m']} micro-batches of {rows}, "
            f"{flavour} schedule")


def check_training(case, values, where):
    for g, out, r, (loss, grads) in against_the_truth(values, where, lambda pipeline: single_process(case, pipeline)):
        for c in range(case["v"]):
            s = r + c * case["p"]
            names = [n for n, _ in chunk_module(case, s).named_parameters()]
            for name, got, want in zip(names, out["grads"][c], grads[s]):
                harness.assert_close(got, want, f"{describe(case)}: gradient of chunk {c} (virtual stage {s})'s "
                                     f"{name}" + (" (added to the .grad already there)" if case["grads_before"]
                                                  else ""), rank=g)
        check_loss(out["loss"], loss, r == case["p"] - 1, describe(case), g, f"rank {r}", "rank p - 1")


@hs.fewer_examples(0.6)
@given(run_cases())
def test_run_matches_single_process(target, case):
    """The real run's loss and every chunk's gradients equal single-process training on the whole batch."""
    check_training(case, run_on_ranks(target, case).values, positions(case["p"], case["p"]))


def in_flight(ops, k):
    """The forwards (numbered in list order) between their F and their B while the k-th op runs: a B's own
    forward is still in flight, since its backward needs what that forward saved."""
    where = {op: n for n, op in enumerate(ops)}
    numbered = [op for op in ops if op[0] == "F"]
    return {f for f, (_, i, c) in enumerate(numbered) if where[("F", i, c)] <= k <= where[("B", i, c)]}


def chunk_calls(calls):
    return " ".join(f"{kind}.{c}" for kind, c in calls)


@hs.fewer_examples(0.6)
@given(run_cases())
def test_activations_are_freed_by_their_backward(target, case):
    """At every chunk forward and backward of the real run, a rank holds activations (what autograd saved in its
    chunks' forwards) only of the forwards its op list has in flight there, so never more than peak(r)."""
    for r, out in enumerate(run_on_ranks(target, case).values):
        ops, events = case["schedule"][r], out["activations"]
        calls, listed = [(kind, c) for kind, c, _ in events], [(kind, c) for kind, _, c in ops]
        harness.check(calls == listed, f"{describe(case)}: rank {r}'s chunks ran forward (F) and backward (B), "
                                       f"as kind.chunk: {chunk_calls(calls)}; its op list asks for "
                                       f"{chunk_calls(listed)}: one chunk forward per F, one backward per B, in "
                                       "list order", rank=r)
        forwards, most = [op for op in ops if op[0] == "F"], max((len(e[2]) for e in events), default=0)
        for k, (op, (_, _, alive)) in enumerate(zip(ops, events)):
            allowed = in_flight(ops, k)
            stale = [forwards[f] for f in alive if f not in allowed]
            harness.check(not stale, f"{describe(case)}: rank {r}, at its op {k} {op}: the activations of "
                                     f"{', '.join(map(repr, stale))} (tensors autograd saved in the chunk forward) are "
                                     f"still alive after the backward; the rank holds {len(alive)} forwards' "
                                     f"activations where its op list has {len(allowed)} in flight (up to {most} at "
                                     f"once in the whole run, against peak(r) = {peak_in_flight(ops)}). A rank "
                                     "holds a chunk's activations from its F to its B: let go of what an F kept once "
                                     "its B has run, and backward without retain_graph", rank=r)


def expected_messages(r, p, v, ops):
    """[(kind, peer, op, whose rank)] in the order the op list needs them; none with p = 1."""
    last, out = p * v - 1, []
    for kind, i, c in ops if p > 1 else []:
        s, op = r + c * p, (kind, i, c)
        take, give = (s > 0, s < last) if kind == "F" else (s < last, s > 0)
        down, up = ((r - 1) % p, "s - 1"), ((r + 1) % p, "s + 1")
        src, dst = (down, up) if kind == "F" else (up, down)
        out += [("recv", *src, op)] * take + [("send", *dst, op)] * give
    return out


# the catalogue's cost model, in the statement's symbols, for the failure messages
P2P_FORMULAS = {"bytes per rank": "2m·v · numel(act_shape) · elem_size on ranks 1 … p − 2, m messages fewer on "
                                  "ranks 0 and p − 1",
                "busiest link": "m·v · numel(act_shape) · elem_size from rank r to r ± 1 with p ≥ 3, m messages "
                                "fewer on the wrap-around link",
                "messages per rank": "2m·v sends on ranks 1 … p − 2, m fewer on ranks 0 and p − 1"}


@hs.fewer_examples(0.6)
@given(run_cases())
def test_p2p_only_to_neighbouring_virtual_stages(target, record_property, case):
    """Each rank sends and receives only to/from the ranks of the previous and next virtual stage, in the order
    its op list needs, act_shape each, sends non-blocking; nothing else (p = 1: nothing at all)."""
    p, v, act = case["p"], case["v"], (case["rows"], case["widths"][1])
    _, trace = run_on_ranks(target, case)
    # the cost model first, in its own words (the op-by-op checks below imply it, and say where order breaks)
    message = math.prod(act) * torch.float64.itemsize
    model = SendCost.of((r, peer, message) for r in range(p)
                        for kind, peer, _, _ in expected_messages(r, p, v, case["schedule"][r]) if kind == "send")
    measured = SendCost.traced(trace)
    check_sends(model, measured, P2P_FORMULAS, describe(case))
    cost.record(record_property, describe(case), model.figures()["bytes per rank"], **figure_pairs(model, measured))
    for r in range(p):
        ops = trace.ops(r)
        want = expected_messages(r, p, v, case["schedule"][r])
        for k, op in enumerate(ops):
            harness.check(k < len(want), f"{describe(case)}: rank {r} issued {len(ops)} ops; its op list needs "
                                         f"{len(want)} sends and receives; extra: {op.describe()}", rank=r)
            kind, peer, stage, owner = want[k]
            harness.check((op.kind, op.peer) == (kind, peer),
                          f"{describe(case)}: rank {r}'s op {k + 1} is {op.describe()}; its op list says {owner} "
                          f"comes next, which {kind}s {'to' if kind == 'send' else 'from'} rank {peer}, the rank "
                          f"of virtual stage {stage} (s = r + c*p)", rank=r)
            harness.check([tuple(x) for x in op.shapes] == [act], f"{describe(case)}: {op.describe()} carries "
                                                                  f"shape {op.shapes}; every message is act_shape "
                                                                  f"{list(act)}", rank=r)
            harness.check(not (kind == "send" and op.blocking), f"{describe(case)}: {op.describe()} blocked until "
                                                                "the peer received it; post sends with dist.isend "
                                                                "and wait for them later", rank=r)
        harness.check(len(ops) == len(want), f"{describe(case)}: rank {r} issued {len(ops)} sends and receives; "
                                             f"its op list needs {len(want)}", rank=r)


def test_no_deadlock(target):
    """The statement's schedule finishes on real ranks for p = 1..4, v in 1, 2, 4 (p*v <= 8), m = p and 2p.
    A hang fails with the harness's hang report: each rank's blocking line."""
    sizes = [(p, v, m) for p in (1, 2, 3, 4) for v in (1, 2, 4) for m in (p, 2 * p) if p * v <= 8]
    for p, v, m in sizes:
        run_on_ranks(target, dict(p=p, v=v, m=m, extra=0, schedule=canonical(p, m, v), rows=1, widths=[2, 2, 1, 1],
                                  seed=100 * p + 10 * v + m, grads_before=False))


@hs.fewer_examples(0.3)
@given(in_groups(run_cases))
def test_runs_inside_a_group(target, drawn):
    """Pipelines of pp consecutive ranks in a larger world: each talks only to its own neighbours (group ranks
    are not global ranks) and trains correctly."""
    world, pp, case = drawn
    where = positions(world, pp)
    values, trace = run_on_ranks(target, case, world, pp)
    for g, (pipeline, r) in where.items():
        ring = group_layout(world, pp)[pipeline]
        allowed = {ring[(r - 1) % pp], ring[(r + 1) % pp]} if pp > 1 else set()
        strays = [op.describe() for op in trace.ops(g, ("send", "recv")) if op.peer not in allowed]
        harness.check(not strays, f"{describe(case)} in group {ring} of a world of {world}: rank {g} (rank {r} of "
                                  f"its group) issued {'; '.join(strays)}; its neighbours are global ranks "
                                  f"{sorted(allowed) or 'none'}", rank=g)
    check_training(case, values, where)
