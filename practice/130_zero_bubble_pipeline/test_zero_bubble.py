"""Problem 130 properties.  Each test is one line of the statement's list ("Properties the tests check").

Learner code runs only on the ranks (``harness.run``; the pure functions on one rank).  The statement's rules
(the dependencies, the ZB-H1 order, exact timing of any schedule, the closed-form makespan, torch's own
zero-bubble schedule) live in ``zb_rules.py``, an oracle in tests/oracles/ (conftest.py imports it), and run
here, in the test process, in exact fractions.  Single-process full-batch training is computed here too.  What
the real run sent comes from the harness's trace; which gradient autograd computed when comes from hooks the
test puts on the layers it hands each rank (``watch``), marked in the same trace with ``harness.phase``.  Each
rank receives only its own stage and what its role needs (``harness.per_rank``).
"""
import math
from fractions import Fraction

import torch
from hypothesis import given, strategies as st
from torch import nn

import harness
from testkit import cost, strategies as hs
from testkit.groups import contiguous_groups, group_layout, positions
from testkit.models import mse, random_mlp
from testkit.pipeline_runs import (against_the_truth, check_loss, check_message, full_batch_step, listed,
                                   run_pipelines, stage_widths)
from testkit.pipeline_cost import ONE_STAGE_PER_RANK, SendCost, check_sends, figure_pairs
from testkit.pipelines import check_deadlock, check_timeline, close, finished, simulated
from testkit.schedule_drawing import record_drawing
from testkit.schedule_strategies import durations, in_groups, schedules_that_finish, sizes

# this problem's oracle (conftest.py makes it importable by name)
from zb_rules import (both, fused_1f1b, in_flight_peak, needs, one_f_one_b, render, replay, timeline,
                      torch_zb_order, zb_h1, zb_makespan)

torch.set_num_threads(1)   # the expected values are tiny: one thread is fastest beside the ranks

SCHEDULE_TYPE = "list[list[tuple[str, int]]]"


# ---- strategies ---------------------------------------------------------------------------------------

def every_op(m):
    return [(kind, i) for kind in "FBW" for i in range(m)]


@st.composite
def feasible_schedules(draw, p=None, m=None):
    """A random schedule that can finish: forwards in micro-batch order, backwards (B) in one order shared by
    every stage, each W anywhere after its own B.  Built by running one random runnable op at a time."""
    p = p or draw(st.integers(1, 5))
    m = m or draw(st.integers(1, 6))
    return draw(schedules_that_finish(needs, p, m, split_w=True))


@st.composite
def shuffled_schedules(draw):
    """Every stage's F, B and W ops in any order: mostly schedules that can never finish."""
    p, m = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    return [list(draw(st.permutations(every_op(m)))) for _ in range(p)]


# ---- the pure functions, each run on one rank ------------------------------------------------------------

def _schedule(target, p, m):
    return target.load().schedule_zb_h1(p, m)


def schedule_of(target, p, m):
    """The learner's schedule_zb_h1(p, m), checked for its type and its p op lists."""
    call = f"schedule_zb_h1({p}, {m})"
    got = harness.expect_type(harness.run(_schedule, 1, target, p, m, reuse=True).values[0], SCHEDULE_TYPE, call)
    harness.check(len(got) == p, f"{call} returned {len(got)} op lists; there is one per stage, p = {p}")
    return got


def simulate(target, schedule, tf=1.0, tb=1.0, tw=1.0, t_comm=0.0):
    return simulated(target, schedule, tf, tb, tw, t_comm)


def feasible(out, call, schedule):
    return finished(out, call, f"the schedule can finish:\n{render(schedule)}")


# ---- the statement's examples (and the drawing judge.py --show prints) -----------------------------------

EXAMPLE = [
    [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("W", 0), ("F", 3), ("B", 1), ("W", 1), ("B", 2), ("W", 2),
     ("B", 3), ("W", 3)],
    [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("W", 0), ("F", 3), ("B", 2), ("W", 1), ("B", 3),
     ("W", 2), ("W", 3)],
    [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("W", 0), ("F", 3), ("B", 3), ("W", 1),
     ("W", 2), ("W", 3)],
]
TIMED = [((1, 1, 1, 0), 14.0, 1 / 7), ((1, 2, 1, 0), 20.0, 0.2)]   # (tf, tb, tw, t_comm), makespan, bubble_ratio
SMALL = [[("F", 0), ("F", 1), ("B", 0), ("W", 0), ("B", 1), ("W", 1)],
         [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("W", 0), ("W", 1)]]
SMALL_EVENTS = [[(("F", 0), 0, 1), (("F", 1), 1, 2), (("B", 0), 4, 5), (("W", 0), 5, 6), (("B", 1), 6, 7),
                 (("W", 1), 7, 8)],
                [(("F", 0), 1.5, 2.5), (("B", 0), 2.5, 3.5), (("F", 1), 3.5, 4.5), (("B", 1), 4.5, 5.5),
                 (("W", 0), 5.5, 6.5), (("W", 1), 6.5, 7.5)]]
STUCK = [[("F", 0), ("W", 0), ("B", 0)]]   # W0 waits for B0, which comes after it


def _drawing(target):
    mod = target.load()
    text = "schedule_zb_h1(3, 4), your op lists:\n"
    try:
        schedule = mod.schedule_zb_h1(3, 4)
        text += render(schedule)
        result = mod.simulate(schedule, 1.0, 1.0, 1.0)
        events = [[(tuple(op), float(a), float(b)) for op, a, b in stage] for stage in result.events]
        return text + "\n\nyour simulate(that, tf=1, tb=1, tw=1), one cell = 1:\n" + render(events, 1.0)
    except Exception as e:  # noqa: BLE001 -- the drawing only says what happened; the tests judge it
        return text + f"\n({type(e).__name__}: {e})"


def test_statement_examples(target, record_property):
    """The statement's worked examples, exactly."""
    record_drawing(record_property, lambda: harness.run(_drawing, 1, target).values[0])
    got = schedule_of(target, 3, 4)
    harness.check(got == EXAMPLE, f"schedule_zb_h1(3, 4) differs from the statement's example:{both(got, EXAMPLE)}")
    got = schedule_of(target, 2, 2)
    harness.check(got == SMALL, f"schedule_zb_h1(2, 2) differs from the statement's example:{both(got, SMALL)}")
    for (tf, tb, tw, t_comm), makespan, bubble in TIMED:
        call = f"simulate(schedule_zb_h1(3, 4), tf={tf}, tb={tb}, tw={tw})"
        out = feasible(simulate(target, EXAMPLE, tf, tb, tw, t_comm), call, EXAMPLE)
        harness.check(close(out["makespan"], makespan) and close(out["bubble_ratio"], bubble),
                      f"{call} gave makespan {out['makespan']:g}, bubble_ratio {out['bubble_ratio']:.4g}; the "
                      f"statement's example says {makespan:g} and {bubble:.4g}:\n{render(out['events'])}")
        harness.check(out["peak_activations"] == [3, 3, 3], f"{call}.peak_activations = {out['peak_activations']}; "
                                                            "the statement's example says [3, 3, 3]")
    call = "simulate(schedule_zb_h1(2, 2), tf=1, tb=1, tw=1, t_comm=0.5)"
    out = feasible(simulate(target, SMALL, 1.0, 1.0, 1.0, 0.5), call, SMALL)
    harness.check(out["events"] == SMALL_EVENTS and close(out["makespan"], 8.0) and close(out["bubble_ratio"], 0.25),
                  f"{call} gave makespan {out['makespan']:g}, bubble_ratio {out['bubble_ratio']:g}, events "
                  f"{out['events']}; the statement's example says 8, 0.25, {SMALL_EVENTS}")
    out = simulate(target, STUCK)
    harness.check("stage 0: ('W', 0)" in out.get("deadlock", ""),
                  f"simulate({STUCK}, ...) must raise ScheduleDeadlock naming stage 0: ('W', 0); it gave {out!r}")


# ---- schedule_zb_h1 --------------------------------------------------------------------------------------

@given(sizes())
def test_every_op_once_w_after_its_b(target, pm):
    """Every stage runs F, B and W of every micro-batch exactly once, B after its F and W after its B, and the
    schedule can finish."""
    p, m = pm
    got = schedule_of(target, p, m)
    call = f"schedule_zb_h1({p}, {m})"
    for s, ops in enumerate(got):
        harness.check(sorted(ops) == sorted(every_op(m)), f"{call}: stage {s} must run each of F0..F{m - 1}, "
                                                          f"B0..B{m - 1} and W0..W{m - 1} exactly once:\n{render(got)}")
        late = [f"{k}{i} before {before}{i}" for i in range(m) for k, before in (("B", "F"), ("W", "B"))
                if ops.index((k, i)) < ops.index((before, i))]
        harness.check(not late, f"{call}: stage {s} runs {', '.join(late[:3])}: a B needs its forward, and a W the "
                                f"output gradients its B computes:\n{render(got)}")
    _, stuck = replay(got)
    harness.check(not stuck, f"{call} can never finish: "
                             f"{', '.join(f'stage {s}: {op}' for s, op in stuck)} wait forever (a B waits for the "
                             f"next stage's B, an F for the previous stage's F):\n{render(got)}")


@given(sizes())
def test_canonical_order(target, pm):
    """The order is exactly the statement's: 1F1B's warm-up, and stage s defers its weight gradients by s."""
    p, m = pm
    got, want = schedule_of(target, p, m), zb_h1(p, m)
    for s, ops in enumerate(got):
        w = min(p - s - 1, m)
        first_b = next((k for k, op in enumerate(ops) if op[0] == "B"), len(ops))
        harness.check(first_b == min(w + 1, m),
                      f"schedule_zb_h1({p}, {m}): stage {s} runs {first_b} forwards before its first B; the warm-up "
                      f"is min(p - s - 1, m) = {w} forwards, then one more if any is left:{both(got, want)}")
        first_w = next((k for k, op in enumerate(ops) if op[0] == "W"), len(ops))
        b_before = sum(op[0] == "B" for op in ops[:first_w])
        harness.check(b_before == min(s + 1, m),
                      f"schedule_zb_h1({p}, {m}): stage {s} runs {b_before} B before its first W; stage s defers "
                      f"its W by s, so W0 comes right after B{min(s, m - 1)} ({min(s + 1, m)} B before it):"
                      f"{both(got, want)}")
    harness.check(got == want, f"schedule_zb_h1({p}, {m}) is not the statement's order:{both(got, want)}")


@given(sizes())
def test_agrees_with_torch_pipelining(target, pm):
    """Where torch.distributed.pipelining has the same configuration (ScheduleInterleavedZeroBubble with one stage
    per rank), its per-rank action lists, idle slots aside and I read as B, are the schedule."""
    p, m = pm
    got, theirs = schedule_of(target, p, m), torch_zb_order(p, m)
    if theirs is None:   # torch refuses m here (m not a multiple of max(1, m // p)): nothing to compare
        return
    harness.check(got == theirs, f"schedule_zb_h1({p}, {m}) differs from torch.distributed.pipelining's "
                                 f"ScheduleInterleavedZeroBubble with one stage per rank (its pipeline_order without "
                                 f"the idle slots, I as B):{both(got, theirs)}")


# ---- simulate --------------------------------------------------------------------------------------------

@given(feasible_schedules(), durations(), durations(), durations(), st.sampled_from([0.0, 0.5, 2.0]))
def test_simulate_follows_the_dependencies(target, schedule, tf, tb, tw, t_comm):
    """Every op starts exactly when its stage is free and what it needs (+ t_comm across a link) has ended, and
    lasts tf, tb or tw; makespan and bubble_ratio follow."""
    call = f"simulate(schedule, tf={tf:g}, tb={tb:g}, tw={tw:g}, t_comm={t_comm:g})"
    out = feasible(simulate(target, schedule, tf, tb, tw, t_comm), call, schedule)
    here = f"{call}, schedule:\n{render(schedule)}\nyour timeline:\n{render(out['events'])}"
    check_timeline(out, schedule, needs, {"F": tf, "B": tb, "W": tw}, t_comm, here, "its ops",
                   "what it needs (+ t_comm across a link) has ended at {ready:g}, so it starts exactly then")


@given(st.one_of(shuffled_schedules(), feasible_schedules()), durations())
def test_deadlocks_are_detected(target, schedule, tf):
    """simulate raises ScheduleDeadlock exactly when the schedule can never finish, naming a stuck op."""
    check_deadlock(simulate(target, schedule, tf, tf, tf), schedule, needs,
                   f"the schedule can finish:\n{render(schedule)}", f"\n{render(schedule)}",
                   "can never finish ({named} wait forever)", "\"stage s: ('W', i)\"")


@given(sizes(), st.data())
def test_peak_activations(target, pm, data):
    """peak_activations: per stage, the most micro-batches between their F and their W (+1 at F, -1 at W);
    min(p, m) on every stage for ZB-H1."""
    p, m = pm
    got = feasible(simulate(target, zb_h1(p, m)), "simulate", zb_h1(p, m))["peak_activations"]
    harness.check(got == [min(p, m)] * p, f"simulate(ZB-H1 with p={p}, m={m}).peak_activations = {got}, expected "
                                          f"{[min(p, m)] * p}: a micro-batch's activations are held from its F to "
                                          f"its W:\n{render(zb_h1(p, m))}")
    schedule = data.draw(feasible_schedules(), label="schedule")
    want = [in_flight_peak(ops) for ops in schedule]
    got = feasible(simulate(target, schedule), "simulate", schedule)["peak_activations"]
    harness.check(got == want, f"peak_activations = {got}, expected {want}: per stage, the most micro-batches "
                               f"forwarded whose W has not run yet:\n{render(schedule)}")


# ---- what the schedule buys --------------------------------------------------------------------------------

@given(sizes(), durations(), durations(), durations())
def test_makespan_and_bubble(target, record_property, pm, tf, tb, tw):
    """Your schedule, timed by the rules, takes m(tf + tb + tw) + (p - 1)(tf + tb) - (min(m, p) - 1)min(tf, tb, tw),
    and your simulate gives that makespan and its bubble on the statement's schedule."""
    p, m = pm
    want, work = zb_makespan(p, m, tf, tb, tw), m * (Fraction(tf) + Fraction(tb) + Fraction(tw))
    bubble = 1 - work / want
    formula = (f"m(tf + tb + tw) + (p - 1)(tf + tb) - (min(m, p) - 1)min(tf, tb, tw) = {float(want):g}, bubble "
               f"{float(bubble):.4g}")
    got = schedule_of(target, p, m)
    timed = timeline(got, tf, tb, tw)
    harness.check(timed is not None, f"schedule_zb_h1({p}, {m}) can never finish:\n{render(got)}")
    harness.check(timed[0] == want, f"schedule_zb_h1({p}, {m}) timed by the statement's rules (tf={tf:g}, tb={tb:g}, "
                                    f"tw={tw:g}) takes {float(timed[0]):g}, bubble fraction "
                                    f"{float(1 - work / timed[0]):.4g}; "
                                    f"the cost model's makespan is {formula}:\n"
                                    f"{render(timed[1], Fraction(min(tf, tb, tw)))}")
    # the catalogue's bubble fraction, of your schedule as the rules time it (checked above through its makespan)
    cost.record(record_property, f"schedule_zb_h1({p}, {m}), tf={tf:g}, tb={tb:g}, tw={tw:g}", p * m,
                bubble_fraction=(float(bubble), float(1 - work / timed[0])))
    call = f"simulate(ZB-H1 with p={p}, m={m}, tf={tf:g}, tb={tb:g}, tw={tw:g})"
    out = feasible(simulate(target, zb_h1(p, m), tf, tb, tw), call, zb_h1(p, m))
    harness.check(close(out["makespan"], float(want)) and close(out["bubble_ratio"], float(bubble)),
                  f"{call} gave makespan {out['makespan']:g}, bubble_ratio {out['bubble_ratio']:.4g}; expected {formula}")


@given(sizes())
def test_peak_memory_no_higher_than_1f1b(target, pm):
    """No stage of your schedule holds more micro-batches' activations (F to W) than 1F1B's busiest stage."""
    p, m = pm
    got = schedule_of(target, p, m)
    peaks, bound = [in_flight_peak(ops) for ops in got], max(in_flight_peak(ops) for ops in one_f_one_b(p, m))
    over = [f"stage {s} holds {k}" for s, k in enumerate(peaks) if k > bound]
    harness.check(not over, f"schedule_zb_h1({p}, {m}): {'; '.join(over)} micro-batches' activations at once "
                            f"(forwarded, W not yet run); 1F1B holds at most {bound} = min(p, m), on stage 0:\n"
                            f"{render(got)}")


# ---- run_zero_bubble on real ranks -----------------------------------------------------------------------

ORDERS = {"ZB-H1": zb_h1, "1F1B (W after its B)": one_f_one_b,
          "1F1B, every W at the end": lambda p, m: [[op for op in row if op[0] != "W"] + [("W", i) for i in range(m)]
                                                    for row in fused_1f1b(p, m)]}


@st.composite
def run_cases(draw, p=None):
    """A real run: 1-4 stages (p = 3 and 4 half the time), 1-6 micro-batches, tiny Linear-Tanh-Linear stages,
    the ZB-H1 order or another feasible one (the run must follow the op list it is given)."""
    p = p or draw(st.one_of(st.integers(3, 4), hs.world_sizes()))
    m = draw(st.integers(1, 6))
    order = draw(st.sampled_from(sorted(ORDERS) + ["random"]))
    ops = ORDERS[order](p, m) if order in ORDERS else draw(feasible_schedules(p, m))
    return dict(p=p, m=m, order=order, ops=ops, rows=draw(st.integers(1, 3)),
                widths=draw(st.lists(st.integers(1, 4), min_size=4, max_size=4)), seed=draw(hs.seeds()),
                grads_before=draw(st.booleans()), dtype=draw(st.sampled_from(sorted(DTYPES))))


DTYPES = {"float32": torch.float32, "float64": torch.float64}
TOLERANCE = {"float32": dict(atol=1e-5, rtol=1e-4), "float64": dict(atol=1e-9, rtol=1e-7)}


def rounded(tensor, case):
    """The float64 tensor holding exactly the values the ranks get in the case's dtype."""
    return tensor.to(DTYPES[case["dtype"]]).double()


def widths_of(case, s):
    """Stage s is Linear, Tanh, Linear: d_in -> h -> d on stage 0, d -> h -> d, ..., d -> h -> d_out."""
    return stage_widths(case["widths"], s, case["p"] - 1)


def stage_module(case, s, pipeline=0):
    """Stage s in float64, its weights rounded to the case's dtype: the ranks get the same values in that dtype."""
    module = random_mlp(widths_of(case, s), case["seed"] + 7919 * s + 104729 * pipeline)
    with torch.no_grad():
        for q in module.parameters():
            q.copy_(rounded(q, case))
    return module


def data(case, pipeline=0):
    d_in, _, _, d_out = case["widths"]
    gen = torch.Generator().manual_seed(case["seed"] + 1 + 104729 * pipeline)
    return [(rounded(torch.randn(case["rows"], d_in, generator=gen, dtype=torch.float64), case),
             rounded(torch.randn(case["rows"], d_out, generator=gen, dtype=torch.float64), case))
            for _ in range(case["m"])]


def old_grads(case, module):
    """What .grad holds before the run: random when the case says so, else None."""
    gen = torch.Generator().manual_seed(case["seed"] + 3)
    return [rounded(torch.randn(q.shape, generator=gen, dtype=q.dtype), case) if case["grads_before"] else None
            for q in module.parameters()]


def stage_inputs(case, where):
    """Rank g = (pipeline, s) gets its own stage (widths, weights, starting .grad) and op list, the micro-batches'
    inputs only on stage 0 and their targets only on the last stage.  Tensors travel as lists: plain data pickles
    the same every time, so harness.run(reuse=True) knows a repeated call."""
    out, last = [], case["p"] - 1
    for g in range(len(where)):
        pipeline, s = where[g]
        module = stage_module(case, s, pipeline)
        xs, ys = zip(*data(case, pipeline))
        out.append({"dtype": case["dtype"], "widths": widths_of(case, s),
                    "weights": [listed(q) for q in module.parameters()],
                    "grads": [listed(q) for q in old_grads(case, module)], "ops": case["ops"][s],
                    "inputs": [listed(x) for x in xs] if s == 0 else None,
                    "targets": [listed(y) for y in ys] if s == last else None})
    return harness.per_rank(out)


def _tensor(values, dtype):
    return None if values is None else torch.tensor(values, dtype=DTYPES[dtype], device=harness.device())


def _mark(kind, n):
    """A zero-length phase in the trace: forward number n of this stage reached its F, B or W computation."""
    with harness.phase(f"mark {kind}", n):
        pass


def watch(stage):
    """On a rank: every Linear of the stage, on its n-th call (the n-th F), marks ("F", n); the gradient of its
    input, once autograd computes it, marks ("B", n); the gradient of its weight or bias marks ("W", n).  The
    layer computes what nn.Linear computes, through views whose gradients autograd must pass to get there."""
    for layer in stage:
        if isinstance(layer, nn.Linear):
            layer.forward = _watched(layer)   # the same module; only this call records what happens to it


def _watched(layer):
    calls = [0]

    def forward(x):
        n, calls[0] = calls[0], calls[0] + 1
        weight, bias = layer.weight.view_as(layer.weight), layer.bias.view_as(layer.bias)
        for param in (weight, bias):
            param.register_hook(lambda grad: _mark("W", n))
        if x.requires_grad:
            x = x.view_as(x)
            x.register_hook(lambda grad: _mark("B", n))
        _mark("F", n)
        return nn.functional.linear(x, weight, bias)
    return forward


def _stage(widths, weights, grads, dtype):
    module = random_mlp(widths, 0, dtype=DTYPES[dtype])
    with torch.no_grad():
        for q, w, g in zip(module.parameters(), weights, grads):
            q.copy_(_tensor(w, dtype))
            q.grad = _tensor(g, dtype)
    watch(module)
    return module


def _pipeline(target, mine, act_shape, pp_size):
    """Runs on every rank: run_zero_bubble on this rank's (watched) stage; with ``pp_size``, inside its group."""
    mod = target.load()
    stage = _stage(mine["widths"], mine["weights"], mine["grads"], mine["dtype"])
    inputs = mine["inputs"] and [_tensor(x, mine["dtype"]) for x in mine["inputs"]]
    targets = mine["targets"] and [_tensor(y, mine["dtype"]) for y in mine["targets"]]
    if pp_size is None:
        loss = _call(mod, stage, mine["ops"], act_shape, inputs, targets, None)
    else:
        with contiguous_groups(pp_size) as (group, _, _):
            loss = _call(mod, stage, mine["ops"], act_shape, inputs, targets, group)
    return {"loss": loss.detach().clone() if isinstance(loss, torch.Tensor) else loss,
            "grads": [None if q.grad is None else q.grad.clone() for q in stage.parameters()]}


def _call(mod, stage, ops, act_shape, inputs, targets, group):
    with harness.phase("pipeline"):
        return mod.run_zero_bubble(stage, ops, act_shape, inputs=inputs, targets=targets, loss_fn=mse, group=group)


def run_on_ranks(target, case, world=None, pp_size=None):
    """One pipeline of case["p"] ranks; or, with ``pp_size``, ``world`` ranks as pipelines of pp_size stages."""
    return run_pipelines(_pipeline, target, case, stage_inputs, world, pp_size)


def single_process(case, pipeline=0):
    """Every stage in sequence on the whole batch, the mean loss, one backward: (loss, grads per stage)."""
    stages = [stage_module(case, s, pipeline) for s in range(case["p"])]
    return full_batch_step(stages, lambda stage: old_grads(case, stage), *zip(*data(case, pipeline)))


def describe(case):
    rows = f"{case['rows']} row" + "s" * (case["rows"] > 1)
    return (f"run_zero_bubble with p={case['p']}, m={case['m']} micro-batches of {rows} in {case['dtype']}, "
            f"{case['order']} op lists")


def check_training(case, values, where):
    for g, out, s, (loss, grads) in against_the_truth(values, where, lambda pipeline: single_process(case, pipeline)):
        names = [n for n, _ in stage_module(case, s).named_parameters()]
        for name, got, want in zip(names, out["grads"], grads[s]):
            harness.assert_close(got, want.to(DTYPES[case["dtype"]]), f"{describe(case)}: gradient of stage {s}'s "
                                 f"{name}" + (" (added to the .grad already there)" if case["grads_before"] else ""),
                                 rank=g, **TOLERANCE[case["dtype"]])
        tolerance = dict(rel_tol=1e-9, abs_tol=1e-12) if case["dtype"] == "float64" else dict(rel_tol=1e-5, abs_tol=1e-6)
        check_loss(out["loss"], loss, s == case["p"] - 1, describe(case), g, f"stage {s}", "the last stage",
                   **tolerance)


@hs.fewer_examples(0.6)
@given(run_cases())
def test_run_matches_single_process(target, case):
    """The real run's loss and every stage's gradients equal single-process training on the whole batch."""
    check_training(case, run_on_ranks(target, case).values, positions(case["p"], case["p"]))


def expected_steps(s, p, ops):
    """What stage s does, in order, for its op list: ('recv', peer), ('send', peer) and ('F' | 'B' | 'W', i)."""
    out = []
    for kind, i in ops:
        if kind == "F":
            out += [("recv", s - 1)] * (s > 0) + [("F", i)] + [("send", s + 1)] * (s < p - 1)
        elif kind == "B":
            out += [("recv", s + 1)] * (s < p - 1) + [("B", i)] + [("send", s - 1)] * (s > 0)
        else:
            out.append(("W", i))
    return out


def observed_steps(trace, rank, ops):
    """The same, from the run: the trace's sends and receives and the layers' marks, in time order; a run of
    marks of one kind and one forward is one step.  Forward number n is the micro-batch of the n-th F op."""
    forwards = [i for kind, i in ops if kind == "F"]
    timed = [(span.start, (span.name.split()[1], forwards[span.step] if span.step < len(forwards) else
                           f"#{span.step}")) for span in trace.phases(rank) if span.name.startswith("mark ")]
    timed += [(op.issued_at, (op.kind, op.peer)) for op in trace.ops(rank, ("send", "recv"))]
    steps = []
    for _, step in sorted(timed, key=lambda e: e[0]):
        if not (steps and step == steps[-1] and step[0] in "FBW"):
            steps.append(step)
    return steps


def _words(steps):
    return " ".join(f"{k}{i}" if k in "FBW" else f"{k}{'<' if k == 'recv' else '>'}{i}" for k, i in steps)


def _around(steps, k):
    """Steps k - 3 .. k + 6, with '>>' in front of step k."""
    head, tail = steps[max(0, k - 3):k], steps[k:k + 7]
    return " ".join(filter(None, ["..." * (k > 3), _words(head), ">>", _words(tail) or "(nothing)",
                                  "..." * (k + 7 < len(steps))]))


@hs.fewer_examples(0.6)
@given(run_cases())
def test_run_follows_the_op_list(target, record_property, case):
    """On every rank, the trace's sends and receives and the layers' gradients come in the op list's order: F
    receives, computes, sends; B receives, computes every input gradient and no weight gradient, sends; W computes
    the weight gradients only, and never before its B; each message act_shape, sends non-blocking."""
    p, act = case["p"], (case["rows"], case["widths"][1])
    _, trace = run_on_ranks(target, case)
    # the cost model first: 1F1B's messages (W sends nothing), each act_shape in the stages' dtype
    message = math.prod(act) * DTYPES[case["dtype"]].itemsize
    model = SendCost.of((s, step[1], message) for s in range(p) for step in expected_steps(s, p, case["ops"][s])
                        if step[0] == "send")
    measured = SendCost.traced(trace)
    check_sends(model, measured, ONE_STAGE_PER_RANK, describe(case))
    cost.record(record_property, describe(case), model.figures()["bytes per rank"], **figure_pairs(model, measured))
    for s in range(p):
        want, got = expected_steps(s, p, case["ops"][s]), observed_steps(trace, s, case["ops"][s])
        k = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        harness.check(got == want, f"{describe(case)}: stage {s}'s op list is "
                                   f"[{' '.join(f'{a}{i}' for a, i in case['ops'][s])}]; it did (>> where it departs "
                                   f"from its op list):\n  {_around(got, k)}\nwhere the op list asks:\n  "
                                   f"{_around(want, k)}\n(recv<r, send>r: a message from or to rank r; Fi, Bi, Wi: "
                                   "autograd ran the forward, the input gradients or the weight gradients of "
                                   "micro-batch i.) B computes the input gradients only, W only the weight gradients, "
                                   "each once, and each op does its communication when it runs", rank=s)
        for op in trace.ops(s):
            check_message(op, act, describe(case), s, "the pipeline")


def test_no_deadlock(target):
    """ZB-H1 finishes on real ranks for every p in 1-4 and m in 1-8.  A hang fails with the harness's hang report."""
    for p in range(1, 5):
        for m in range(1, 9):
            run_on_ranks(target, dict(p=p, m=m, order="ZB-H1", ops=zb_h1(p, m), rows=1, widths=[2, 2, 2, 1],
                                      seed=100 * p + m, grads_before=False, dtype="float64"))


@hs.fewer_examples(0.3)
@given(in_groups(run_cases))
def test_pipeline_inside_a_group(target, drawn):
    """Pipelines of pp consecutive ranks in a larger world: each talks only inside its group (group ranks are not
    global ranks) and trains correctly."""
    world, pp, case = drawn
    values, trace = run_on_ranks(target, case, world, pp)
    layout, where = group_layout(world, pp), positions(world, pp)
    for g in range(world):
        i, s = where[g]
        allowed = {layout[i][s + d] for d in (-1, 1) if 0 <= s + d < pp}
        strays = [op.describe() for op in trace.ops(g) if op.peer not in allowed]
        harness.check(not strays, f"{describe(case)} in group {layout[i]} of a world of {world}: stage {s} issued "
                                  f"{'; '.join(strays)}; its neighbours are global ranks {sorted(allowed) or 'none'}",
                      rank=g)
    check_training(case, values, where)
