"""Problem 131 properties.  Each test is one line of the statement's list ("Properties the tests check").

Learner code runs only on the ranks (``harness.run``; the pure functions on one rank), each rank receiving only
its own shard of the batch (``harness.per_rank``).  The model is a chain of attention and MLP units defined
here.  Expected values come from the same units run without checkpointing, single-process, in float64, here in
the test process; so do the units' costs (``unit_costs``: bytes saved for backward, measured with
``harness.saved_for_backward``, and forward FLOPs, counted by torch's ``FlopCounterMode``).  On the ranks, the
memory a plan holds is measured by ``harness.saved_for_backward`` around the whole step (``SavedPeak``) and the
FLOPs by the harness's ``Flops`` probe (problems.yaml: probes), never taken from the code under test.  The
statement's cost model and the least recompute FLOPs for a budget come from ``checkpoint_plans.py``, an oracle
in tests/oracles/ (conftest.py imports it).
"""
import contextlib
import math

import torch
import torch.nn.functional as F
from hypothesis import example, given, strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import harness
from testkit import cost, strategies as hs
from testkit.groups import contiguous_groups

# the oracle (tests/oracles/131_activation_checkpointing/, imported by conftest.py)
from checkpoint_plans import check_plan, least_flops, least_peak, peak_bytes, recompute_flops

torch.set_num_threads(1)   # the expected values are tiny: one thread is fastest beside the ranks

PLAN_TYPE = "list[tuple[int, int, bool]]"
DTYPES = {"float64": torch.float64, "float32": torch.float32}


# ---- the model: a chain of units, each x -> x + f(x) on [rows, seq, hidden] ----------------------------

class Attention(nn.Module):
    """LayerNorm, the QKV projection, softmax(q k^T / sqrt(d)) with dropout on the probabilities, times v,
    the output projection, the residual."""

    def __init__(self, hidden, heads, ffn, p, dtype):
        super().__init__()
        self.heads, self.p = heads, p
        self.norm = nn.LayerNorm(hidden, dtype=dtype, device="cpu")
        self.qkv = nn.Linear(hidden, 3 * hidden, dtype=dtype, device="cpu")
        self.proj = nn.Linear(hidden, hidden, dtype=dtype, device="cpu")

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        probs = (q @ k.transpose(-1, -2) / math.sqrt(h // self.heads)).softmax(-1)
        mixed = F.dropout(probs, self.p, training=True) @ v
        return x + self.proj(mixed.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    """LayerNorm, the up projection to ``ffn``, GELU, the down projection, dropout, the residual."""

    def __init__(self, hidden, heads, ffn, p, dtype):
        super().__init__()
        self.p = p
        self.norm = nn.LayerNorm(hidden, dtype=dtype, device="cpu")
        self.up = nn.Linear(hidden, ffn, dtype=dtype, device="cpu")
        self.down = nn.Linear(ffn, hidden, dtype=dtype, device="cpu")

    def forward(self, x):
        return x + F.dropout(self.down(F.gelu(self.up(self.norm(x)))), self.p, training=True)


KINDS = {"attention": Attention, "mlp": MLP}


def build_units(model):
    """The chain ``model`` describes, its weights drawn from its seed on the CPU, moved to ``harness.device()``."""
    gen = torch.Generator().manual_seed(model["seed"])
    dtype = DTYPES[model["dtype"]]
    units = []
    for kind in model["kinds"]:
        unit = KINDS[kind](model["hidden"], model["heads"], model["ffn"], model["p"], dtype)
        with torch.no_grad():
            for q in unit.parameters():   # weights randn / sqrt(fan_in), biases and LayerNorm's shifts near 0
                scale = q.shape[1] ** -0.5 if q.dim() == 2 else 0.1
                q.copy_(torch.randn(q.shape, generator=gen, dtype=dtype, device="cpu") * scale)
            unit.norm.weight.add_(1.0)
        units.append(unit.to(harness.device()))
    return units


def parameters(units):
    return [q for unit in units for q in unit.parameters()]


def batch(model, case):
    """The global batch (x, y): world_size * rows rows of [seq, hidden]; x needs no gradient."""
    gen = torch.Generator().manual_seed(model["seed"] + 1)
    shape = (case["world_size"] * case["rows"], model["seq"], model["hidden"])
    dtype = DTYPES[model["dtype"]]
    return torch.randn(shape, generator=gen, dtype=dtype), torch.randn(shape, generator=gen, dtype=dtype)


def shards(model, case):
    x, y = batch(model, case)
    return harness.per_rank(list(zip(x.tensor_split(case["world_size"]), y.tensor_split(case["world_size"]))))


def unit_costs(model, rows):
    """Per unit: s, the bytes it saves for backward when it runs with autograd (its input included, the
    parameters aside; unit 0's input is the batch, which is the caller's); a, its input's bytes (a[0] = 0);
    f, its forward FLOPs.  Measured here, single-process, on a [rows, seq, hidden] input."""
    s, a, f = [], [], []
    dtype = DTYPES[model["dtype"]]
    with FlopCounterMode(display=False) as counter:   # one counter for all units: entering one costs ~50 ms
        for u, unit in enumerate(build_units(model)):
            x = torch.randn(rows, model["seq"], model["hidden"], dtype=dtype, requires_grad=u > 0)
            before = counter.get_total_flops()
            with harness.saved_for_backward() as saved:
                out = unit(x)   # held: the graph, and what it saved, lives as long as its output
            s.append(saved.storages(exclude=[list(unit.parameters())] + ([] if u else [x])).nbytes)
            a.append(x.numel() * x.element_size() if u else 0)
            f.append(int(counter.get_total_flops() - before))
            del out
    return s, a, f


def plain_flops(model, rows):
    """The FLOPs of one plain forward and backward of the chain (no recompute), loss included."""
    units = build_units(model)
    dtype = DTYPES[model["dtype"]]
    x = torch.randn(rows, model["seq"], model["hidden"], dtype=dtype)
    with FlopCounterMode(display=False) as counter:
        out = x
        for unit in units:
            out = unit(out)
        F.mse_loss(out, torch.zeros_like(out)).backward()
    return int(counter.get_total_flops())


# ---- on the ranks ----------------------------------------------------------------------------------------

class SavedPeak:
    """On a rank: the most bytes of tensors autograd holds for backward at any moment the harness looks --
    at the end of each unit's forward (the first time and in backward's recomputes) and when the loss is
    taken -- the parameters, the batch and the output aside (``harness.saved_for_backward``)."""

    def __init__(self, units, saved, aside):
        self.saved, self.aside, self.backward = saved, list(aside), False
        self.peak, self.where, self.what = 0, "nowhere", "nothing"
        for u, unit in enumerate(units):
            unit.forward = self._watched(u, unit.forward)   # the same module, each call looked at as it returns

    def _watched(self, u, forward):
        def watched(x):
            out = forward(x)
            self.look(f"at the end of unit {u}'s forward" + (" (recomputed in backward)" if self.backward else ""))
            return out
        return watched

    def look(self, where):
        held = self.saved.storages(exclude=self.aside)
        if held.nbytes > self.peak:
            self.peak, self.where, self.what = held.nbytes, where, held.describe(8)

    def loss(self, out, y):
        """The loss the step is given: the end of the forward is looked at first."""
        self.aside.append(out)
        self.look("when the loss is taken (the end of the forward)")
        self.backward = True
        return F.mse_loss(out, y)


def _train(target, model, mine, plan=None, budget=None, costs=None, steps=1, lr=0.1, seed=None, group_size=None):
    """Runs on every rank: ``steps`` of train_step on this rank's shard, SGD between them, memory watched.

    With ``budget``, the plan is the learner's plan_checkpoints(*costs, budget); with ``seed``, the RNG is
    seeded before the first step (dropout); with ``group_size``, data parallelism runs inside groups of that
    many consecutive ranks."""
    mod = target.load()
    x, y = mine
    units = build_units(model)
    out = {}
    if budget is not None:
        try:
            plan = mod.plan_checkpoints(*costs, budget)
        except ValueError as e:
            return {"planner": f"ValueError: {e}"}
        out["plan"] = plan
        if check_plan(plan, len(units)) is not None:   # the test process says what is wrong with it
            return out
    if seed is not None:
        torch.manual_seed(seed)
    groups = contiguous_groups(group_size) if group_size else contextlib.nullcontext((None, None, None))
    out.update(losses=[], grads=[], peaks=[])
    with groups as (group, _, _):
        for step in range(steps):
            for q in parameters(units):
                q.grad = None
            with harness.phase("step", step=step), harness.saved_for_backward() as saved:
                watch = SavedPeak(units, saved, [parameters(units), x, y])
                loss = mod.train_step(units, plan, x, y, watch.loss, group=group)
            for unit in units:
                del unit.forward
            out["losses"].append(loss)
            out["grads"].append([None if q.grad is None else q.grad.detach().clone() for q in parameters(units)])
            out["peaks"].append([watch.peak, watch.where, watch.what])
            with torch.no_grad():
                for q in parameters(units):
                    if q.grad is not None:
                        q.sub_(lr * q.grad)
    return out


def run_case(target, case, **kwargs):
    return harness.run(_train, case["world_size"], target, case["model"], shards(case["model"], case), reuse=True,
                       **kwargs)


def reference(case, steps=1, lr=0.1, seeds=None, group_size=None):
    """The same steps without checkpointing, single-process, float64: per step, each rank's loss and each
    rank's gradients after averaging over its group.  With ``seeds``, rank r's dropout draws from its own RNG
    stream, seeded with seeds[r] (as torch.manual_seed on that rank)."""
    model, n = case["model"], case["world_size"]
    size = group_size or n
    x, y = batch(model, case)
    xs, ys = x.tensor_split(n), y.tensor_split(n)
    replicas = [build_units(model) for _ in range(n)]
    states = None
    if seeds is not None:
        with torch.random.fork_rng(devices=[]):
            states = []
            for seed in seeds:
                torch.manual_seed(seed)
                states.append(torch.get_rng_state())
    history = []
    for _ in range(steps):
        losses, grads = [], []
        for r in range(n):
            with torch.random.fork_rng(devices=[]):
                if states is not None:
                    torch.set_rng_state(states[r])
                out = xs[r]
                for unit in replicas[r]:
                    out = unit(out)
                loss = F.mse_loss(out, ys[r])
                grads.append(torch.autograd.grad(loss, parameters(replicas[r])))
                if states is not None:
                    states[r] = torch.get_rng_state()
            losses.append(loss.item())
        mean = []
        for r in range(n):
            first = r // size * size
            mean.append([sum(g[i] for g in grads[first:first + size]) / size for i in range(len(grads[r]))])
        history.append((losses, mean))
        with torch.no_grad():
            for r in range(n):
                for q, g in zip(parameters(replicas[r]), mean[r]):
                    q.sub_(lr * g)
    return history


# ---- strategies ----------------------------------------------------------------------------------------

@st.composite
def models(draw, dtypes=("float64",), p=(0.0,)):
    """A chain of 1-6 units: transformer layers (attention then MLP) half the time, any order otherwise."""
    if draw(st.booleans()):
        kinds = ["attention", "mlp"] * draw(st.integers(1, 3))
    else:
        kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=6))
    hidden = draw(st.sampled_from([4, 6, 8]))
    return dict(kinds=kinds, hidden=hidden, heads=draw(st.sampled_from([h for h in (1, 2) if hidden % h == 0])),
                ffn=hidden * draw(st.sampled_from([1, 2, 4])), seq=draw(st.integers(2, 5)),
                p=draw(st.sampled_from(p)), dtype=draw(st.sampled_from(dtypes)), seed=draw(hs.seeds()))


@st.composite
def plans(draw, n, must_recompute=False):
    """Any plan of n units: each unit kept or recomputed, each cut between recomputed units made or not."""
    kinds = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    if must_recompute and not any(kinds):
        kinds[draw(st.integers(0, n - 1))] = True
    plan, start = [], 0
    for i in range(1, n + 1):
        if i == n or kinds[i] != kinds[i - 1] or draw(st.booleans()):
            plan.append((start, i, kinds[start]))
            start = i
    return plan


@st.composite
def step_cases(draw):
    """A model, 1-4 ranks with 1-2 rows each, a plan, and groups of consecutive ranks (sometimes)."""
    n = draw(hs.world_sizes())
    model = draw(models())
    return dict(world_size=n, rows=draw(st.integers(1, 2)), model=model, plan=draw(plans(len(model["kinds"]))),
                group_size=draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0])))


@st.composite
def budget_cases(draw):
    """A model with dropout, its measured costs, and a budget between the least peak and keeping everything;
    now and then exactly some plan's peak."""
    n = draw(hs.world_sizes())
    model = draw(models(dtypes=tuple(DTYPES), p=(0.0, 0.25)))
    rows = draw(st.integers(1, 2))
    s, a, f = unit_costs(model, rows)
    low, high = least_peak(s, a), sum(s)
    if draw(st.booleans()):
        budget = peak_bytes(draw(plans(len(s))), s, a)
    else:
        budget = low + (high - low) * draw(st.integers(0, 8)) // 8
    return dict(world_size=n, rows=rows, model=model, costs=(s, a, f), budget=max(budget, low))


@st.composite
def dropout_cases(draw):
    """Dropout (p = 0.1 or 0.5) in every unit, a plan with at least one recomputed segment, two steps, and a
    seed per rank."""
    n = draw(hs.world_sizes())
    model = draw(models(p=(0.1, 0.5)))
    return dict(world_size=n, rows=draw(st.integers(1, 2)), model=model,
                plan=draw(plans(len(model["kinds"]), must_recompute=True)),
                seeds=[draw(hs.seeds()) for _ in range(n)])


@st.composite
def planner_cases(draw):
    """Costs of 1-10 units (a[u] <= s[u], a[0] = 0) and a budget near or above the least peak, or below it."""
    n = draw(st.integers(1, 10))
    s = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    a = [0] + [draw(st.integers(0, b)) for b in s[1:]]
    f = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    low = least_peak(s, a)
    budget = draw(st.one_of(st.integers(max(0, low - 5), low + 5), st.integers(low, sum(s) + 5)))
    return dict(s=s, a=a, f=f, budget=budget)


TRANSFORMER = dict(kinds=["attention", "mlp", "attention", "mlp"], hidden=4, heads=2, ffn=8, seq=3, p=0.0,
                   dtype="float64", seed=7)


def at_least_peak(world_size, rows, model):
    """A budget case at the least peak: the tightest plans, several recomputed segments."""
    s, a, f = unit_costs(model, rows)
    return dict(world_size=world_size, rows=rows, model=model, costs=(s, a, f), budget=least_peak(s, a))


# ---- describing a case ---------------------------------------------------------------------------------

def chain(model):
    extra = f", dropout p = {model['p']}" if model["p"] else ""
    return (f"a chain of {len(model['kinds'])} units {model['kinds']} (hidden {model['hidden']}, {model['heads']} "
            f"head(s), ffn {model['ffn']}, seq {model['seq']}, {model['dtype']}{extra})")


def describe(case, plan):
    group = (f", data parallel in groups of {case['group_size']} consecutive ranks"
             if case.get("group_size") not in (None, case["world_size"]) else "")
    return (f"train_step on {case['world_size']} rank(s) of {case['rows']} row(s) each{group}, {chain(case['model'])}"
            f", plan {plan}")


def check_step(case, values, expected, plan, what, step_word=""):
    names = [f"unit {u} ({kind})'s {name}" for u, (kind, unit) in
             enumerate(zip(case["model"]["kinds"], build_units(case["model"]))) for name, _ in unit.named_parameters()]
    for r, out in enumerate(values):
        for step, (got_loss, got_grads) in enumerate(zip(out["losses"], out["grads"])):
            losses, grads = expected[step]
            harness.expect_type(got_loss, "float", "train_step(...)", rank=r)
            harness.check(math.isclose(got_loss, losses[r], rel_tol=1e-9, abs_tol=1e-12),
                          f"{describe(case, plan)}{what}: train_step returned the loss {got_loss!r}, but this rank's "
                          f"loss_fn(out, y) without checkpointing is {losses[r]!r}", rank=r, step=step)
            for name, got, want in zip(names, got_grads, grads[r]):
                harness.check(got is not None, f"{describe(case, plan)}{what}: {name} has no gradient after "
                              "train_step (a recomputed segment's parameters must get theirs too, even when its "
                              "input needs none)", rank=r, step=step)
                harness.assert_close(got, want, f"{describe(case, plan)}{what}: the gradient of {name}, averaged "
                                     f"over the group, against the same model without checkpointing{step_word}",
                                     rank=r, step=step, atol=1e-10, rtol=1e-8)


# ---- properties ----------------------------------------------------------------------------------------

def _sqrt(target, n):
    return target.load().sqrt_segments(n)


@given(st.integers(1, 40))
def test_sqrt_segments(target, n):
    """sqrt_segments(L): segments of ceil(sqrt(L)) units in order, the last one shorter, all recomputed."""
    got = harness.run(_sqrt, 1, target, n).values[0]
    harness.expect_type(got, PLAN_TYPE, f"sqrt_segments({n})")
    k = math.isqrt(n - 1) + 1
    want = [(i, min(i + k, n), True) for i in range(0, n, k)]
    harness.check(got == want, f"sqrt_segments({n}) returned {got}; with k = ceil(sqrt({n})) = {k} it is {want}: "
                  "segments of k units from unit 0, the last one what is left, every one recomputed")


def _plan(target, s, a, f, budget):
    try:
        return {"plan": target.load().plan_checkpoints(s, a, f, budget)}
    except ValueError as e:
        return {"ValueError": str(e)}


@example(dict(s=[6, 5, 8, 5], a=[0, 2, 2, 2], f=[3, 8, 3, 8], budget=13))   # the statement's worked example
@example(dict(s=[6, 5, 8, 5], a=[0, 2, 2, 2], f=[3, 8, 3, 8], budget=12))
@example(dict(s=[6, 5, 8, 5], a=[0, 2, 2, 2], f=[3, 8, 3, 8], budget=9))
@given(planner_cases())
def test_plan_is_optimal(target, case):
    """plan_checkpoints: a valid plan whose peak (the statement's model) is within the budget and whose
    recompute FLOPs are the least any such plan has; ValueError when no plan fits."""
    s, a, f, budget = case["s"], case["a"], case["f"], case["budget"]
    call = f"plan_checkpoints(s={s}, a={a}, f={f}, budget={budget})"
    out = harness.run(_plan, 1, target, s, a, f, budget).values[0]
    low = least_peak(s, a)
    if budget < low:
        harness.check("ValueError" in out, f"{call} returned {out.get('plan')}, but no plan fits: the least peak "
                      f"of any plan is {low} bytes; raise ValueError")
        return
    harness.check("plan" in out, f"{call} raised ValueError({out.get('ValueError')!r}), but a plan fits: the least "
                  f"peak is {low} <= {budget}")
    plan = harness.expect_type(out["plan"], PLAN_TYPE, call)
    wrong = check_plan(plan, len(s))
    harness.check(wrong is None, f"{call} returned {plan}: {wrong}")
    peak, flops, best = peak_bytes(plan, s, a), recompute_flops(plan, f), least_flops(s, a, f, budget)
    harness.check(peak <= budget, f"{call} returned {plan}, whose peak is {peak} bytes > {budget} (the end of the "
                  "forward holds held(L); a recomputed segment [i, j) holds held(i) + s[i] + ... + s[j-1] while it "
                  "is recomputed)")
    harness.check(flops == best, f"{call} returned {plan}, which recomputes {flops} FLOPs; the least for this budget "
                  f"is {best}")


@hs.fewer_examples(0.4)
@example(dict(world_size=3, rows=1, model=TRANSFORMER, plan=[(0, 1, True), (1, 2, False), (2, 4, True)], group_size=3))
@example(dict(world_size=4, rows=2, model=TRANSFORMER, plan=[(0, 2, True), (2, 4, False)], group_size=2))
@given(step_cases())
def test_values_and_gradients_unchanged(target, case):
    """Any plan: the loss and the group-averaged gradients equal the same model's without checkpointing."""
    plan = case["plan"]
    values, _ = run_case(target, case, plan=plan, group_size=case["group_size"])
    check_step(case, values, reference(case, group_size=case["group_size"]), plan, "")


def budget_run(target, case):
    values, _ = result = run_case(target, case, budget=case["budget"], costs=case["costs"])
    s, a, f = case["costs"]
    call = f"plan_checkpoints(s={s}, a={a}, f={f}, budget={case['budget']})"
    for r, out in enumerate(values):
        harness.check("planner" not in out, f"{chain(case['model'])}: {call} raised {out.get('planner')}, but the "
                      f"least peak is {least_peak(s, a)} bytes", rank=r)
        harness.expect_type(out["plan"], PLAN_TYPE, call, rank=r)
        wrong = check_plan(out["plan"], len(s))
        harness.check(wrong is None, f"{call} returned {out['plan']}: {wrong}", rank=r)
    return result


@hs.fewer_examples(0.4)
@example(at_least_peak(2, 1, dict(TRANSFORMER, p=0.25)))
@given(budget_cases())
def test_saved_bytes_within_budget(target, record_property, case):
    """The learner's plan for the budget, run by train_step: the saved-for-backward bytes the harness sees
    alive (end of each unit's forward, recomputes included, and the loss) never pass the budget."""
    values, _ = budget_run(target, case)
    s, a, _ = case["costs"]
    # the cost table: the plan's peak in the statement's model beside the one the harness saw (rank 0's plan)
    cost.record(record_property, describe(case, values[0]["plan"]), sum(s),
                saved_bytes=(peak_bytes(values[0]["plan"], s, a), values[0]["peaks"][0][0]))
    for r, out in enumerate(values):
        peak, where, what = out["peaks"][0]
        model_peak = peak_bytes(out["plan"], s, a)
        hint = (" (a uint8 tensor of 5056 B is an RNG state: keep it as an attribute, not with save_for_backward)"
                if "uint8 [5056]" in what else "")
        harness.check(peak <= case["budget"], f"{describe(case, out['plan'])}: the tensors autograd held for "
                      f"backward reached {peak} bytes {where}, over the budget of {case['budget']} (this plan's "
                      f"peak in the statement's model is {model_peak}; s = {s}, a = {a}); held then: {what}{hint}",
                      rank=r)


@hs.fewer_examples(0.4)
@example(at_least_peak(2, 1, dict(TRANSFORMER, p=0.25)))
@given(budget_cases())
def test_recompute_flops_minimal(target, record_property, case):
    """The same run: the FLOPs the harness counted, less one plain forward and backward, are the least
    recompute FLOPs of any plan within the budget (the oracle's dynamic programme)."""
    values, _ = result = budget_run(target, case)
    s, a, f = case["costs"]
    base, best = plain_flops(case["model"], case["rows"]), least_flops(s, a, f, case["budget"])
    cost.record(record_property, describe(case, values[0]["plan"]), sum(f),
                recompute_flops=(best, max(result.flops) - base))   # the busiest rank's, checked below on each
    for r, out in enumerate(values):
        counted = result.flops[r]
        harness.check(counted - base == best, f"{describe(case, out['plan'])}: the harness counted {counted} FLOPs "
                      f"on this rank, {counted - base} more than one plain forward and backward ({base}); the least "
                      f"recompute for the budget of {case['budget']} bytes is {best} FLOPs (f = {f}; this plan "
                      f"recomputes {recompute_flops(out['plan'], f)} in the model: each recomputed unit runs its "
                      "forward once more, nothing else)", rank=r)


@hs.fewer_examples(0.3)
@example(dict(world_size=2, rows=1, model=dict(TRANSFORMER, p=0.5), plan=[(0, 2, True), (2, 3, False), (3, 4, True)],
              seeds=[11, 12]))
@given(dropout_cases())
def test_dropout_rng_replayed(target, case):
    """Dropout in recomputed units, two steps with SGD between: each step's loss and gradients equal the run
    without checkpointing from the same RNG seed on each rank (the recompute draws the masks the forward drew,
    and leaves the RNG where the forward left it)."""
    plan = case["plan"]
    values, _ = run_case(target, case, plan=plan, steps=2, seed=harness.per_rank(case["seeds"]))
    check_step(case, values, reference(case, steps=2, seeds=case["seeds"]), plan,
               ", dropout drawn from torch.manual_seed(seed) on each rank",
               " from the same seed (the recompute must draw the masks the first forward drew, then leave the "
               "RNG where the forward left it)")
