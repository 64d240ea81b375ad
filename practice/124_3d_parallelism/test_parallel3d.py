"""Problem 124 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); the single-process model is trained here,
in the test process, in float64.  Each rank is given only its own stage's blocks and the data its
role needs (``harness.per_rank``).  Which entries of the full model a rank holds is found by
value (``grid3d.py``, beside this file), never by reading attribute names.  What moved between
ranks comes from the harness's trace.  Training runs get the process groups built by the test in
Megatron's order, so a wrong ``make_groups`` fails only the groups' own property.
"""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import example, given, settings, strategies as st

import harness
from testkit import cost, strategies as hs

# this folder's own helper, grid3d.py (conftest.py makes it importable by name)
from grid3d import (Placement, coords, distinct_full_model, drop_groups, factorisations, grid_groups, group_of,
                    layout, shard_index)

torch.set_num_threads(1)
TOLERANCE = {"float64": dict(atol=1e-9, rtol=1e-7), "float32": dict(atol=1e-4, rtol=1e-4)}


# ---- make_groups -----------------------------------------------------------------------------------

def _groups(target, world):
    """Runs on every rank: make_groups for every factorisation of the world, one after another."""
    mod, out = target.load(), []
    for dp, tp, pp in factorisations(world):
        g = mod.make_groups(world, dp, tp, pp)
        try:
            out.append({"ranks": {kind: sorted(dist.get_process_group_ranks(getattr(g, f"{kind}_group")))
                                  for kind in ("dp", "tp", "pp")},
                        "coords": [int(g.dp_rank), int(g.tp_rank), int(g.pp_rank)]})
        finally:
            drop_groups(g.dp_group, g.tp_group, g.pp_group)
    return out


def test_groups_follow_megatron_order(target):
    """For every factorisation dp*tp*pp of every world of 1-8 ranks, each rank's three groups and its
    coordinates are Megatron's: tp fastest, then dp, then pp."""
    for world in range(1, 9):
        values = harness.run(_groups, world, target, world).values
        for rank, results in enumerate(values):
            for (dp, tp, pp), got in zip(factorisations(world), results):
                what = f"make_groups({world}, dp={dp}, tp={tp}, pp={pp})"
                for kind in ("tp", "dp", "pp"):
                    want = group_of(kind, rank, dp, tp, pp)
                    harness.check(got["ranks"][kind] == want,
                                  f"{what}: the {kind} group of rank {rank} holds ranks {got['ranks'][kind]}; in "
                                  f"Megatron's order (rank = pp_rank*dp*tp + dp_rank*tp + tp_rank) it is {want}, "
                                  f"one of {layout(kind, dp, tp, pp)}", rank=rank)
                d, t, p = coords(rank, dp, tp, pp)
                harness.check(got["coords"] == [d, t, p],
                              f"{what}: rank {rank} got (dp_rank, tp_rank, pp_rank) = {tuple(got['coords'])}; "
                              f"it is ({d}, {t}, {p})", rank=rank)


def _make_groups_error(target, args):
    try:
        target.load().make_groups(*args)
    except ValueError as e:
        return str(e)
    return None


@st.composite
def bad_factorisations(draw):
    n = draw(hs.world_sizes())
    dp, tp, pp = (draw(st.integers(1, 4)) for _ in range(3))
    if dp * tp * pp == n:
        pp += 1
    return n, dp, tp, pp


@hs.fewer_examples(0.2)
@given(bad_factorisations())
def test_bad_factorisation_raises_value_error(target, drawn):
    """dp*tp*pp != world_size raises ValueError naming both numbers."""
    n, dp, tp, pp = drawn
    for rank, message in enumerate(harness.run(_make_groups_error, n, target, [n, dp, tp, pp]).values):
        call = f"make_groups({n}, dp={dp}, tp={tp}, pp={pp}) (dp*tp*pp = {dp * tp * pp})"
        harness.check(message is not None, f"{call} did not raise ValueError", rank=rank)
        harness.check(str(dp * tp * pp) in message and str(n) in message,
                      f"{call} raised ValueError({message!r}); the message must name dp*tp*pp = {dp * tp * pp} and "
                      f"the world size {n}", rank=rank)


# ---- the drawn training cases -----------------------------------------------------------------------

# the layouts that expose the classic bugs come first: tp and pp together, dp with pp, odd sizes
KEY_LAYOUTS = [(1, 2, 2), (2, 1, 2), (2, 2, 1), (1, 1, 3), (1, 3, 1), (3, 1, 1), (1, 1, 2), (1, 4, 1), (4, 1, 1),
               (1, 1, 4), (2, 1, 1), (1, 2, 1), (1, 1, 1)]


@st.composite
def cases(draw, layouts=KEY_LAYOUTS):
    dp, tp, pp = draw(st.sampled_from(layouts))
    return dict(dp=dp, tp=tp, pp=pp, m=draw(st.sampled_from([2, 3, 1])), blocks=pp * draw(st.integers(1, 2)),
                d=draw(st.integers(1, 3)), hidden=tp * draw(st.integers(1, 2)), mb=draw(st.integers(1, 2)),
                steps=draw(st.integers(1, 2)), lr=draw(st.sampled_from([0.1, 0.05])),
                dtype=draw(st.sampled_from(["float64", "float32"])), seed=draw(hs.seeds()))


def key_examples(test):
    """The layouts that expose the classic bugs, run on every profile: tp and pp together, dp and pp
    together, dp and tp together (float32), an odd pipeline; each with m >= 2 or several steps."""
    for case in (dict(dp=1, tp=2, pp=2, m=2, blocks=2, d=2, hidden=2, mb=1, steps=2, lr=0.1, dtype="float64", seed=1),
                 dict(dp=2, tp=1, pp=2, m=2, blocks=4, d=2, hidden=1, mb=2, steps=2, lr=0.1, dtype="float64", seed=2),
                 dict(dp=2, tp=2, pp=1, m=3, blocks=1, d=3, hidden=4, mb=1, steps=1, lr=0.05, dtype="float32", seed=3),
                 dict(dp=1, tp=1, pp=3, m=3, blocks=3, d=1, hidden=2, mb=1, steps=1, lr=0.1, dtype="float64", seed=4)):
        test = example(case)(test)
    return test


def training_property(test):
    """The drawn training cases (the same for every property below, so they share each run) and the key ones."""
    return hs.fewer_examples(0.3)(given(cases())(key_examples(test)))


def _world(case):
    return case["dp"] * case["tp"] * case["pp"]


def full_model(case) -> dict:
    """The full model's tensors, every value distinct, as the case's dtype holds them (in float64)."""
    dtype = getattr(torch, case["dtype"])
    full = distinct_full_model(case["blocks"], case["d"], case["hidden"], case["seed"])
    return {name: t.to(dtype).to(torch.float64) for name, t in full.items()}


def global_batches(case) -> list:
    """``steps`` global batches (x, y) of B = dp*m*mb rows, as the case's dtype holds them (in float64)."""
    dtype = getattr(torch, case["dtype"])
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    rows = case["dp"] * case["m"] * case["mb"]
    return [tuple(torch.randn(rows, case["d"], generator=gen, dtype=torch.float64).to(dtype).to(torch.float64)
                  for _ in range(2)) for _ in range(case["steps"])]


def _forward(full, blocks, x):
    for b in range(blocks):
        h = F.gelu(F.linear(x, full[f"blocks.{b}.fc1.weight"], full[f"blocks.{b}.fc1.bias"]))
        x = F.linear(h, full[f"blocks.{b}.fc2.weight"], full[f"blocks.{b}.fc2.bias"])
    return x


def single_process(case):
    """Plain SGD on the whole global batch, MSE loss: (the full tensors after training, per step: each dp
    replica's loss on its slice of the batch before that step's update)."""
    full = {name: t.clone().requires_grad_() for name, t in full_model(case).items()}
    losses = []
    for x, y in global_batches(case):
        with torch.no_grad():
            out = _forward(full, case["blocks"], x)
            losses.append([F.mse_loss(o, t).item() for o, t in zip(out.tensor_split(case["dp"]),
                                                                   y.tensor_split(case["dp"]))])
        loss = F.mse_loss(_forward(full, case["blocks"], x), y)
        grads = torch.autograd.grad(loss, list(full.values()))
        with torch.no_grad():
            for t, g in zip(full.values(), grads):
                t -= case["lr"] * g
    return {name: t.detach() for name, t in full.items()}, losses


def _linear(weight, bias):
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype, device=harness.device())
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    return layer


def _train(target, case, given):
    """Runs on every rank: Parallel3D on the test's Megatron groups, ``steps`` train_steps, one phase each."""
    mod = target.load()
    dtype, where = getattr(torch, case["dtype"]), harness.device()

    def tensor(values):
        return torch.tensor(values, dtype=dtype, device=where)

    blocks = [None if block is None else
              (_linear(tensor(block["fc1.weight"]), tensor(block["fc1.bias"])),
               _linear(tensor(block["fc2.weight"]), tensor(block["fc2.bias"])))
              for block in given["blocks"]]
    batches = given["batches"]
    d, t, p = coords(dist.get_rank(), case["dp"], case["tp"], case["pp"])
    with grid_groups(case["dp"], case["tp"], case["pp"]) as g:
        groups = mod.Groups(dp_group=g["dp"], tp_group=g["tp"], pp_group=g["pp"], dp_rank=d, tp_rank=t, pp_rank=p)
        with harness.phase("construct"):
            model = mod.Parallel3D(blocks, groups, case["m"], case["lr"])
        held = [q.detach().clone() for q in model.parameters()]
        losses = []
        for step, (x, y) in enumerate(batches):
            with harness.phase("step", step):
                loss = model.train_step(tensor(x), tensor(y))
            losses.append(loss.item() if isinstance(loss, torch.Tensor) and loss.numel() == 1 else loss)
        return {"held": held, "final": [q.detach().clone() for q in model.parameters()], "losses": losses}


LAYERS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def given_to_ranks(case):
    """per_rank: each rank's blocks (the whole matrices of its own stage's blocks, None for the others' blocks)
    and, for each step, its replica's rows of x and y: x with its values on stage 0 only, y on the last stage
    only, NaN of the same shape elsewhere.  Tensors travel as lists (plain data)."""
    full, batches = full_model(case), global_batches(case)
    dp, pp = case["dp"], case["pp"]
    per = case["blocks"] // pp

    def role(rows, has_it):
        return (rows if has_it else torch.full_like(rows, float("nan"))).tolist()

    given = []
    for rank in range(_world(case)):
        d, _, p = coords(rank, dp, case["tp"], pp)
        blocks = [{k: full[f"blocks.{b}.{k}"].tolist() for k in LAYERS} if p * per <= b < (p + 1) * per else None
                  for b in range(case["blocks"])]
        steps = [[role(x.tensor_split(dp)[d], p == 0), role(y.tensor_split(dp)[d], p == pp - 1)]
                 for x, y in batches]
        given.append({"blocks": blocks, "batches": steps})
    return harness.per_rank(given)


def run_case(target, case):
    """One run per drawn case, shared by the properties below (reuse)."""
    return harness.run(_train, _world(case), target, case, given_to_ranks(case), reuse=True)


def describe(case) -> str:
    return (f"Parallel3D with dp={case['dp']}, tp={case['tp']}, pp={case['pp']}: {case['blocks']} blocks "
            f"Linear({case['d']}, {case['hidden']}) -> GELU -> Linear({case['hidden']}, {case['d']}), "
            f"m={case['m']} micro-batches of {case['mb']} rows, lr={case['lr']}, {case['dtype']}")


def mine(case, rank) -> dict:
    """full tensor name -> the flat indices rank ``rank`` must hold: its stage's blocks, its tp shard of each."""
    d, t, p = coords(rank, case["dp"], case["tp"], case["pp"])
    per = case["blocks"] // case["pp"]
    full = full_model(case)
    return {name: shard_index(name, tuple(full[name].shape), t, case["tp"]) for name in full
            if p * per <= int(name.split(".")[1]) < (p + 1) * per}


def check_training(case, values):
    full, (trained, _) = full_model(case), single_process(case)
    for rank, out in enumerate(values):
        placement = Placement(full, out["held"], rank)
        placement.check_exactly(mine(case, rank), describe(case))
        placement.check_values(out["final"], trained, f"{describe(case)}, after {case['steps']} train_step(s)",
                               **TOLERANCE[case["dtype"]])


def check_losses(case, values):
    _, losses = single_process(case)
    for rank, out in enumerate(values):
        d, _, p = coords(rank, case["dp"], case["tp"], case["pp"])
        for step, got in enumerate(out["losses"]):
            what = f"{describe(case)}: train_step {step} on rank {rank} (dp_rank {d}, stage {p})"
            if p < case["pp"] - 1:
                harness.check(got is None, f"{what} returned {got!r}; only the last stage returns the loss, the "
                                           "others return None", rank=rank)
                continue
            want = losses[step][d]
            harness.check(isinstance(got, (int, float)) and math.isclose(got, want, **_close(case)),
                          f"{what} returned {got!r}; the loss of this replica's slice of the batch is {want:.10g} "
                          "(the sum over its micro-batches of MSE / m)", rank=rank)


def _close(case):
    tol = TOLERANCE[case["dtype"]]
    return dict(rel_tol=tol["rtol"], abs_tol=tol["atol"])


def check_confined(case, trace):
    dp, tp, pp = case["dp"], case["tp"], case["pp"]
    for rank in range(_world(case)):
        tp_ranks, dp_ranks = tuple(group_of("tp", rank, dp, tp, pp)), tuple(group_of("dp", rank, dp, tp, pp))
        p = coords(rank, dp, tp, pp)[2]
        neighbours = [rank + s * dp * tp for s in (-1, 1) if 0 <= p + s < pp]
        for op in trace.ops(rank):
            if op.phase not in ("construct", "step"):
                continue                       # the test's own group set-up
            if op.is_p2p:
                harness.check(op.peer in neighbours,
                              f"{describe(case)}: stage {p} issued {op.describe()}; point-to-point goes only to the "
                              f"neighbouring stages' rank with the same (dp, tp) coordinates: {neighbours} "
                              "(rank +- dp*tp)", rank=rank)
            else:
                harness.check(op.group in (tp_ranks, dp_ranks, (rank,)),
                              f"{describe(case)}: {op.describe()} ran on ranks {list(op.group)}; collectives run "
                              f"only in this rank's tp group {list(tp_ranks)} (activations) or its dp group "
                              f"{list(dp_ranks)} (gradients)", rank=rank)


# the catalogue's cost model: figure -> its closed form, the statement's (a the bytes of one activation)
BYTES_FORMULAS = {"tp": "m · (2·L_s − [s = 0]) · a", "pp": "m · a · ([s < pp−1] + [s > 0])",
                  "dp": "L_s · (2·d·h/tp + h/tp + d) · e", "busiest link": "max(tp, dp, m · a)"}
WHERE = {"pp": "point-to-point", "busiest link": "on its busiest group or point-to-point link"}


def expected_bytes(case, rank) -> dict:
    """Bytes one rank hands its ops in one train_step, by group (pp: its sends), and the busiest link: the
    statement's formulas."""
    dp, tp, pp, m = case["dp"], case["tp"], case["pp"], case["m"]
    e = 8 if case["dtype"] == "float64" else 4
    p = coords(rank, dp, tp, pp)[2]
    per, act = case["blocks"] // pp, case["mb"] * case["d"] * e
    d, h = case["d"], case["hidden"]
    want = {"tp": m * (2 * per - (p == 0)) * act if tp > 1 else 0,
            "pp": m * act * ((p > 0) + (p < pp - 1)),
            "dp": per * (2 * d * h // tp + h // tp + d) * e if dp > 1 else 0}
    # one tp or dp group carries all of its figure; a pp link, one direction to one neighbour, m activations
    return {**want, "busiest link": max(want["tp"], want["dp"], m * act if pp > 1 else 0)}


def check_bytes(case, trace) -> dict:
    """Checks every rank's figures, every step; returns {figure: (the model's, yours)}, the most over the ranks
    in step 0, for the cost table."""
    dp, tp, pp = case["dp"], case["tp"], case["pp"]
    shown = {}
    for rank in range(_world(case)):
        groups = {"tp": tuple(group_of("tp", rank, dp, tp, pp)), "dp": tuple(group_of("dp", rank, dp, tp, pp))}
        want = expected_bytes(case, rank)
        for step in range(case["steps"]):
            ops = trace.ops(rank, phase="step", step=step)
            sends = [op for op in ops if op.kind == "send"]
            got = {"pp": sum(op.in_bytes for op in sends)}
            for kind, ranks in groups.items():
                got[kind] = sum(op.in_bytes for op in ops if not op.is_p2p and op.group == ranks and len(ranks) > 1)
                for op in ops:
                    if not op.is_p2p and op.group == ranks and len(ranks) > 1:
                        harness.check(op.kind == "all_reduce", f"{describe(case)}: train_step {step} issued "
                                      f"{op.describe()} in the {kind} group; only all_reduce is expected there",
                                      rank=rank)
            per_peer = [sum(op.in_bytes for op in sends if op.peer == peer) for peer in {op.peer for op in sends}]
            got["busiest link"] = max([got["tp"], got["dp"], *per_peer])
            for kind in ("tp", "pp", "dp", "busiest link"):
                harness.check(got[kind] == want[kind],
                              f"{describe(case)}: {kind if kind == 'busiest link' else f'{kind} bytes per rank'}: in "
                              f"train_step {step} this rank sent {got[kind]} bytes "
                              f"{WHERE.get(kind, f'in its {kind} group')}; the cost model's {BYTES_FORMULAS[kind]} "
                              f"gives {want[kind]}", rank=rank)
            if step == 0:
                for kind in want:
                    model, yours = shown.get(kind, (0, 0))
                    shown[kind] = (max(model, want[kind]), max(yours, got[kind]))
    return {(kind if kind == "busiest link" else f"{kind} bytes per rank").replace(" ", "_"): pair
            for kind, pair in shown.items()}


@training_property
def test_training_matches_single_process(target, case):
    """After k train_steps, every rank's parameters are exactly its shard (its stage's blocks, its tp slice of
    each) and equal the matching entries of a single-process model trained on the same global batches."""
    check_training(case, run_case(target, case).values)


@training_property
def test_train_step_returns_the_loss(target, case):
    """The last stage's ranks return their replica's loss before the update; every other stage returns None."""
    check_losses(case, run_case(target, case).values)


@training_property
def test_communication_stays_confined(target, case):
    """Collectives run only in the rank's tp or dp group; point-to-point only with the neighbouring stages'
    rank of the same (dp, tp) coordinates."""
    check_confined(case, run_case(target, case).trace)


@training_property
def test_bytes_per_step(target, record_property, case):
    """Each train_step, each rank sends exactly the formula's bytes: tp all_reduce, p2p, dp all_reduce, and its
    busiest link carries the most of them."""
    figures = check_bytes(case, run_case(target, case).trace)
    # the case that uses the most of tp, pp and dp is shown, the largest of those
    used = sum(model > 0 for name, (model, _) in figures.items() if name != "busiest_link")
    cost.record(record_property, describe(case), used * 10**9 + sum(model for model, _ in figures.values()), **figures)


@settings(max_examples=2)
@given(cases(layouts=[(2, 2, 2)]))
def test_eight_ranks_dp2_tp2_pp2(target, case):
    """dp = tp = pp = 2 on 8 ranks: training, loss, confinement and bytes all hold."""
    values, trace = run_case(target, case)
    check_confined(case, trace)
    check_training(case, values)
    check_losses(case, values)
    check_bytes(case, trace)


# ---- sizes that do not split --------------------------------------------------------------------------

def _construct_only(target, case, full):
    """Parallel3D on sizes that do not split: every rank is given every block (there are no stages)."""
    mod = target.load()
    d, t, p = coords(dist.get_rank(), case["dp"], case["tp"], case["pp"])

    def tensor(name):
        return torch.tensor(full[name], dtype=torch.float64, device=harness.device())

    blocks = [(_linear(tensor(f"blocks.{b}.fc1.weight"), tensor(f"blocks.{b}.fc1.bias")),
               _linear(tensor(f"blocks.{b}.fc2.weight"), tensor(f"blocks.{b}.fc2.bias")))
              for b in range(case["blocks"])]
    with grid_groups(case["dp"], case["tp"], case["pp"]) as g:
        groups = mod.Groups(dp_group=g["dp"], tp_group=g["tp"], pp_group=g["pp"], dp_rank=d, tp_rank=t, pp_rank=p)
        try:
            mod.Parallel3D(blocks, groups, case["m"], case["lr"])
        except ValueError as e:
            return str(e)
    return None


@st.composite
def indivisible_cases(draw):
    case = draw(cases(layouts=[(1, 2, 2), (1, 1, 2), (1, 2, 1), (1, 1, 3), (1, 3, 1), (2, 2, 1), (2, 1, 2)]))
    bad = draw(st.sampled_from([k for k in ("blocks", "hidden") if case[{"blocks": "pp", "hidden": "tp"}[k]] > 1]))
    size = case["pp"] if bad == "blocks" else case["tp"]
    case[bad] = size * draw(st.integers(0, 1)) + draw(st.integers(1, size - 1))
    return case, bad


@hs.fewer_examples(0.2)
@given(indivisible_cases())
def test_indivisible_model_raises_value_error(target, drawn):
    """A number of blocks that pp does not divide, or a hidden width that tp does not divide, raises ValueError."""
    case, bad = drawn
    full = {name: t.tolist() for name, t in full_model(case).items()}
    values = harness.run(_construct_only, _world(case), target, case, full).values
    size = f"{case['blocks']} blocks and pp={case['pp']}" if bad == "blocks" else \
        f"hidden width {case['hidden']} and tp={case['tp']}"
    for rank, message in enumerate(values):
        harness.check(message is not None, f"{describe(case)}: Parallel3D(...) with {size} did not raise "
                                           "ValueError", rank=rank)
