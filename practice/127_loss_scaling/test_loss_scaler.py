"""Problem 127 properties.  Each test is one line of the statement's list.

The learner's ``DistributedLossScaler`` runs on real ranks inside a training loop this file owns: torch's
``DistributedDataParallel`` with ``no_sync()`` for the first k-1 micro-batches, the forward under
``torch.autocast("cpu", dtype=float16 or bfloat16)``.  An overflow is injected into one rank's gradient after
DDP has averaged the gradients, so only that rank sees it.  The expected training comes from
``torch.amp.GradScaler("cpu")`` on the whole global batch in the test process (same autocast dtype, the same
overflow injected into its gradient); what was communicated comes from the harness's trace.
"""
import contextlib

import torch
import torch.distributed as dist
from hypothesis import example, given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.groups import contiguous_groups, member_group
from testkit.models import OptimizerSpec, mse, random_batches, random_mlp, shard

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
POISON = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


@st.composite
def scaling_cases(draw):
    """A tiny MLP, 1-4 ranks, k micro-batches, up to 6 steps, maybe one overflow on one rank at one step."""
    world_size = draw(hs.world_sizes())
    widths = draw(st.lists(st.integers(2, 4), min_size=2, max_size=3))
    steps = draw(st.integers(2, 6))
    n_params = 2 * (len(widths) - 1)
    inject = None
    if draw(st.sampled_from([True, True, True, False])):   # mostly one overflow, sometimes none
        inject = dict(step=draw(st.integers(0, steps - 1)), rank=draw(st.integers(0, world_size - 1)),
                      param=draw(st.integers(0, n_params - 1)), index=draw(st.integers(0, 1)),
                      kind=draw(st.sampled_from(sorted(POISON))))
    return dict(world_size=world_size, widths=widths, k=draw(st.integers(1, 3)), micro=draw(st.integers(1, 2)),
                steps=steps, dtype=draw(st.sampled_from(sorted(DTYPES))), param_groups=draw(st.integers(1, 2)),
                scaler=dict(init_scale=2.0 ** draw(st.integers(1, 5)), growth_factor=2.0,
                            backoff_factor=draw(st.sampled_from([0.5, 0.25])),
                            growth_interval=draw(st.integers(1, 3))),
                optimizer=draw(st.sampled_from([OptimizerSpec("SGD", {"lr": 0.05, "momentum": 0.9}),
                                                OptimizerSpec("SGD", {"lr": 0.1, "weight_decay": 0.1}),
                                                OptimizerSpec("SGD", {"lr": 0.1})])),
                explicit_unscale=draw(st.booleans()), inject=inject, seed=draw(hs.seeds()))


def global_batches(case):
    """Every step's global batch: world_size ranks x k micro-batches x ``micro`` rows, float32."""
    return random_batches(case["steps"], case["world_size"] * case["k"] * case["micro"], case["widths"][0],
                          case["widths"][-1], case["seed"] + 1, dtype=torch.float32)


def build_optimizer(optimizer, model, param_groups):
    """The optimizer over the model's parameters, in one group, or in two (the second half, at half the lr)."""
    params = list(model.parameters())
    if param_groups == 1:
        return optimizer.build(params)
    half = len(params) // 2
    return optimizer.build([{"params": params[:half]}, {"params": params[half:], "lr": optimizer.kwargs["lr"] / 2}])


def micro_batches(x, y, rank, world, k):
    return list(zip(shard(x, rank, world).tensor_split(k), shard(y, rank, world).tensor_split(k)))


def poison(model, inject):
    """Write the injected inf / -inf / NaN into one gradient element."""
    grad = list(model.parameters())[inject["param"]].grad
    with torch.no_grad():
        grad.view(-1)[inject["index"] % grad.numel()] = POISON[inject["kind"]]


def _train(target, widths, k, micro, steps, dtype, param_groups, scaler, optimizer, explicit_unscale, inject, seed,
           group_size=None):
    """Runs on every rank: DDP + no_sync accumulation under autocast, the learner's scaler around each step.

    With ``group_size``, the ranks form independent data-parallel groups of that many consecutive ranks, each
    training its own replica on the same global batch, and the scaler gets its group.
    """
    from torch.nn.parallel import DistributedDataParallel
    with contextlib.ExitStack() as stack:
        if group_size is None:
            group, members, _ = stack.enter_context(member_group())
        else:
            group, members, _ = stack.enter_context(contiguous_groups(group_size))
        rank, world = members.index(dist.get_rank()), len(members)
        where = harness.device().type   # "cpu" under gloo
        with harness.phase("construct"):
            model = random_mlp(widths, seed, dtype=torch.float32)
            ddp = DistributedDataParallel(model, process_group=group)
            build = target.load().DistributedLossScaler
            loss_scaler = build(**scaler) if group_size is None else build(**scaler, group=group)
        opt = build_optimizer(optimizer, model, param_groups)
        batches = random_batches(steps, world * k * micro, widths[0], widths[-1], seed + 1, dtype=torch.float32)
        history, scales = [], []
        for step, (x, y) in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            for i, (xm, ym) in enumerate(micro_batches(x, y, rank, world, k)):
                with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
                    with harness.phase("forward", step=step), torch.autocast(where, dtype=DTYPES[dtype]):
                        out = ddp(xm)
                    loss = mse(out.float(), ym) / k
                    with harness.phase("scale", step=step):
                        scaled = loss_scaler.scale(loss)
                    with harness.phase("backward", step=step):
                        scaled.backward()
            if inject is not None and inject["step"] == step and inject["rank"] == dist.get_rank():
                poison(model, inject)
            with harness.phase("scaler", step=step):
                if explicit_unscale:
                    loss_scaler.unscale_(opt)
                loss_scaler.step(opt)
                loss_scaler.update()
            history.append([p.detach().clone() for p in model.parameters()])
            scales.append(loss_scaler.get_scale())
        return {"history": history, "scales": scales}


def run_case(target, case):
    """One run per drawn case, shared by the properties below (reuse)."""
    args = {key: value for key, value in case.items() if key != "world_size"}
    return harness.run(_train, case["world_size"], target, reuse=True, **args)


def initial_params(case):
    return [p.detach().clone() for p in random_mlp(case["widths"], case["seed"], dtype=torch.float32).parameters()]


def oracle(case):
    """torch.amp.GradScaler("cpu") on the whole global batch, single process, the same autocast dtype.

    Returns the parameter names, the parameters after each step and the scale after each update.
    """
    model = random_mlp(case["widths"], case["seed"], dtype=torch.float32)
    opt = build_optimizer(case["optimizer"], model, case["param_groups"])
    scaler = torch.amp.GradScaler("cpu", **case["scaler"])
    history, scales = [], []
    for step, (x, y) in enumerate(global_batches(case)):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=DTYPES[case["dtype"]]):
            out = model(x)
        scaler.scale(mse(out.float(), y)).backward()
        if case["inject"] is not None and case["inject"]["step"] == step:
            poison(model, case["inject"])
        scaler.step(opt)
        scaler.update()
        history.append([p.detach().clone() for p in model.parameters()])
        scales.append(scaler.get_scale())
    return [n for n, _ in model.named_parameters()], history, scales


def check_against_oracle(case, history, expected, rank, message, names):
    """Parameters after each step against the oracle's.

    The ranks and the oracle round different partial sums to the autocast dtype, so the gradients differ by a
    few units of roundoff u of the update they make; the tolerance is 32 u times the sum of the oracle's step
    sizes so far (0 while every step was skipped).
    """
    u = UNIT_ROUNDOFF[case["dtype"]]
    moved, prev = 0.0, initial_params(case)
    for step, (got_params, want_params) in enumerate(zip(history, expected)):
        moved += max((a - b).abs().max().item() for a, b in zip(want_params, prev))
        prev = want_params
        for name, got, want in zip(names, got_params, want_params):
            harness.assert_close(got, want, message.format(name=name), rank=rank, step=step,
                                 atol=32 * u * moved + 1e-12, rtol=0)


def describe(case):
    inject = case["inject"]
    where = (f"{inject['kind']} written into one gradient element of rank {inject['rank']} only, after DDP's "
             f"all-reduce, at step {inject['step']}" if inject else "no overflow injected")
    s = case["scaler"]
    groups = " in two parameter groups (the second at half the lr)" if case["param_groups"] == 2 else ""
    return (f"{case['world_size']} rank(s), k={case['k']} micro-batch(es), {case['dtype']} autocast, "
            f"{case['optimizer']}{groups}, DistributedLossScaler(init_scale={s['init_scale']:g}, growth_factor="
            f"{s['growth_factor']:g}, backoff_factor={s['backoff_factor']:g}, growth_interval={s['growth_interval']})"
            f", {'unscale_() then ' if case['explicit_unscale'] else ''}step() then update() each step, {where}")


EXAMPLES = [  # the classic bugs' cases: an overflow on a rank other than 0 after some clean steps, then more steps;
    # one in the second of two parameter groups
    dict(world_size=3, widths=[3, 4, 2], k=2, micro=1, steps=5, dtype="float16", param_groups=1,
         scaler=dict(init_scale=8.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2),
         optimizer=OptimizerSpec("SGD", {"lr": 0.05, "momentum": 0.9}), explicit_unscale=True,
         inject=dict(step=1, rank=1, param=0, index=0, kind="inf"), seed=0),
    dict(world_size=2, widths=[2, 3], k=3, micro=1, steps=4, dtype="bfloat16", param_groups=1,
         scaler=dict(init_scale=4.0, growth_factor=2.0, backoff_factor=0.25, growth_interval=1),
         optimizer=OptimizerSpec("SGD", {"lr": 0.1, "weight_decay": 0.1}), explicit_unscale=False,
         inject=dict(step=2, rank=1, param=1, index=1, kind="nan"), seed=1),
    dict(world_size=2, widths=[3, 2], k=1, micro=1, steps=3, dtype="float16", param_groups=2,
         scaler=dict(init_scale=4.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=1),
         optimizer=OptimizerSpec("SGD", {"lr": 0.1}), explicit_unscale=False,
         inject=dict(step=1, rank=1, param=1, index=0, kind="-inf"), seed=2),
]


def scaling_property(test):
    """One drawing for the properties below, so they share each case's run; the classic bugs' cases first."""
    for case in EXAMPLES:
        test = example(case)(test)
    return hs.fewer_examples(0.5)(given(scaling_cases())(test))


@scaling_property
def test_overflow_on_one_rank_skips_everywhere(target, case):
    """An inf/NaN on one rank only: every rank skips that step and backs the scale off the same way."""
    values, _ = run_case(target, case)
    inject = case["inject"]
    if inject is None:
        return
    s = inject["step"]
    for rank, out in enumerate(values):
        before = out["history"][s - 1] if s else initial_params(case)
        for i, (got, prev) in enumerate(zip(out["history"][s], before)):
            harness.check(torch.equal(got, prev), f"{describe(case)}: parameter {i} changed at step {s}, but rank "
                          f"{inject['rank']} found {inject['kind']} in its gradients, so every rank must skip "
                          "optimizer.step() (the found-inf flag has to be combined over the ranks, and the "
                          "gradients left alone, not zeroed and stepped)", rank=rank, step=s)
        scale_before = out["scales"][s - 1] if s else case["scaler"]["init_scale"]
        want = scale_before * case["scaler"]["backoff_factor"]
        harness.check(out["scales"][s] == want, f"{describe(case)}: get_scale() after update() is "
                      f"{out['scales'][s]!r}; after the skipped step it must be the scale before it ({scale_before:g})"
                      f" times backoff_factor = {want:g}, on every rank", rank=rank, step=s)


@scaling_property
def test_parameters_identical_across_ranks(target, case):
    """Parameters stay bit-identical across ranks at every step."""
    values, _ = run_case(target, case)
    for rank, out in enumerate(values[1:], start=1):
        for step in range(case["steps"]):
            for i, (got, ref) in enumerate(zip(out["history"][step], values[0]["history"][step])):
                harness.check(torch.equal(got, ref), f"{describe(case)}: parameter {i} differs from rank 0's "
                              f"(max abs diff {(got - ref).abs().max().item():.3g}); data parallel replicas must stay "
                              "bit-identical: same skip decision and same scale on every rank", rank=rank, step=step)


@scaling_property
def test_matches_grad_scaler(target, case):
    """Training equals single-process torch.amp.GradScaler on the global batch."""
    values, _ = run_case(target, case)
    names, expected, _ = oracle(case)
    for rank, out in enumerate(values):
        check_against_oracle(case, out["history"], expected, rank, f"{describe(case)}: parameter {{name}}, against "
                             "torch.amp.GradScaler training the same model on the whole global batch (gradients "
                             "unscaled exactly once per step, the step skipped on an overflow)", names)


@scaling_property
def test_scale_sequence_matches_grad_scaler(target, case):
    """The scale grows only after growth_interval clean steps: the scale after each update() equals GradScaler's."""
    values, _ = run_case(target, case)
    _, _, expected = oracle(case)
    for rank, out in enumerate(values):
        for step, (got, want) in enumerate(zip(out["scales"], expected)):
            harness.expect_type(got, "float", "get_scale()")
            if got != want:
                history = ", ".join(f"{v:g}" for v in expected[:step + 1])
                harness.check(False, f"{describe(case)}: get_scale() after update() is {got:g}, GradScaler's is "
                              f"{want:g} (its scales so far: {history}). Back off and restart the count of clean "
                              "steps after an overflow; grow only when growth_interval clean steps in a row have "
                              "passed, then restart the count", rank=rank, step=step)


@scaling_property
def test_found_inf_flag_is_all_reduced_each_step(target, record_property, case):
    """Each step, the found-inf decision is combined by a collective over the ranks: a flag, not the gradients."""
    _, trace = run_case(target, case)
    if case["world_size"] == 1:
        return
    model = random_mlp(case["widths"], case["seed"], dtype=torch.float32)
    n_tensors = len(list(model.parameters()))
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    limit = 8 * n_tensors   # the cost model's bound on bytes per rank: a flag per parameter tensor at most
    world = tuple(range(case["world_size"]))
    figures = []
    for rank in range(case["world_size"]):
        for step in range(case["steps"]):
            ops = trace.ops(rank, phase="scaler", step=step)
            collectives = [op for op in ops if not op.is_p2p and op.group == world]
            harness.check(collectives, f"{describe(case)}: unscale_()/step()/update() issued no collective over the "
                          f"{case['world_size']} ranks ({len(ops)} ops in all), but messages per rank in the cost "
                          "model is ≥ 1: the found-inf flag must be combined (all_reduce, MAX or SUM) so that an "
                          "overflow on any rank skips the step on every rank", rank=rank, step=step)
            sent = sum(op.in_bytes for op in ops)
            harness.check(sent <= limit and sent < grad_bytes,
                          f"{describe(case)}: unscale_()/step()/update() communicated {sent} bytes "
                          f"({', '.join(op.describe() for op in ops)}), but bytes per rank in the cost model is "
                          f"≤ 8 · n_tensors = {limit}: the decision needs a flag (one per parameter tensor at "
                          f"most), and DDP has already averaged the {grad_bytes} bytes of gradients",
                          rank=rank, step=step)
            figures.append((sent, len(ops)))
    cost.record(record_property, describe(case), grad_bytes * case["world_size"],
                bytes_per_rank=(limit, max(f[0] for f in figures)), messages_per_rank=(1, max(f[1] for f in figures)))


# ---- float16 gradients: an overflow is an element, not a sum ---------------------------------------

FP16_GRAD = 60000.0     # finite in float16 (largest 65504), and a multiple of its spacing there: exact


@st.composite
def float16_cases(draw):
    """A float16 weight whose scaled gradient is 60000 in every element: each element finite, their sum (even
    unscaled, with at least 2 S elements) far past float16's 65504."""
    scale = 2.0 ** draw(st.integers(1, 5))
    return dict(world_size=draw(hs.world_sizes()), init_scale=scale,
                numel=draw(st.integers(int(2 * scale), int(4 * scale))), explicit_unscale=draw(st.booleans()))


def _float16_step(target, init_scale, numel, explicit_unscale):
    """Runs on every rank: a float16 model (w * c).sum(), one scaled backward, unscale_/step/update."""
    scaler = target.load().DistributedLossScaler(init_scale=init_scale, growth_interval=1)
    weight = torch.nn.Parameter(torch.ones(numel, dtype=torch.float16, device=harness.device()))
    opt = torch.optim.SGD([weight], lr=0.5)
    c = torch.full((numel,), FP16_GRAD / init_scale, dtype=torch.float16, device=harness.device())
    scaler.scale((weight * c).sum()).backward()            # weight.grad = S * c = 60000 in every element
    if explicit_unscale:
        scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    return {"weight": weight.detach().clone(), "scale": scaler.get_scale()}


@hs.fewer_examples(0.2)
@example(dict(world_size=2, init_scale=2.0, numel=4, explicit_unscale=False))
@given(float16_cases())
def test_float16_gradients_whose_sum_overflows_are_clean(target, case):
    """float16 gradients whose every element is finite but whose sum is past 65504: no overflow, the step is
    taken and the scale grows."""
    values, _ = harness.run(_float16_step, case["world_size"], target, case["init_scale"], case["numel"],
                            case["explicit_unscale"])
    s, numel = case["init_scale"], case["numel"]
    unscaled = torch.full((numel,), FP16_GRAD / s, dtype=torch.float16)
    want = torch.ones(numel, dtype=torch.float16).add_(unscaled, alpha=-0.5)
    what = (f"a float16 weight of {numel} elements whose scaled gradient is {FP16_GRAD:g} in every element "
            f"(finite: float16 reaches 65504; their sum {numel * FP16_GRAD:g}, unscaled {numel * FP16_GRAD / s:g}, "
            f"is not), {case['world_size']} rank(s), init_scale={s:g}, growth_interval=1, "
            f"{'unscale_() then ' if case['explicit_unscale'] else ''}step() then update()")
    for rank, out in enumerate(values):
        harness.check(out["scale"] == 2 * s, f"{what}: get_scale() after update() is {out['scale']:g}, but no "
                      f"element is inf or NaN, so the step is clean and the scale grows to {2 * s:g} (an overflow "
                      "is an element that is inf or NaN, not a sum of finite elements that overflows)", rank=rank)
        harness.assert_close(out["weight"], want, f"{what}: the weight after SGD(lr=0.5).step() on the unscaled "
                             f"gradient {FP16_GRAD / s:g} (the step is clean and must be taken)", rank=rank,
                             atol=0, rtol=0)


@st.composite
def group_cases(draw):
    """Independent data-parallel groups of consecutive ranks; one overflow in one group."""
    world_size, group_size = draw(st.sampled_from([(2, 1), (3, 1), (4, 2), (4, 1)]))
    case = draw(scaling_cases())
    steps = case["steps"]
    inject = dict(step=draw(st.integers(0, steps - 1)), rank=draw(st.integers(0, world_size - 1)),
                  param=0, index=0, kind=draw(st.sampled_from(sorted(POISON))))
    return dict(case, world_size=world_size, group_size=group_size, inject=inject)


@hs.fewer_examples(0.2)
@given(group_cases())
def test_runs_on_a_process_group(target, case):
    """With group=, the decision is shared inside the group only: an overflow in one group skips only that group."""
    args = {key: value for key, value in case.items() if key != "world_size"}
    values, trace = harness.run(_train, case["world_size"], target, **args)
    size = case["group_size"]
    for rank, out in enumerate(values):
        first = rank // size * size
        members = tuple(range(first, first + size))
        hit = case["inject"]["rank"] in members
        group_case = dict(case, world_size=size, inject=case["inject"] if hit else None)
        names, expected, scales = oracle(group_case)
        what = (f"{describe(case)}, in groups of {size} consecutive ranks out of {case['world_size']}; the "
                f"overflow is on rank {case['inject']['rank']}, {'in' if hit else 'outside'} this rank's group "
                f"{list(members)}")
        harness.check(out["scales"] == scales, f"{what}: the scales after each update() are {out['scales']}, "
                      f"GradScaler's are {scales}: the group with the overflow skips and backs off, the others do not; "
                      "the flag is combined over group=, not over every rank", rank=rank)
        check_against_oracle(case, out["history"], expected, rank, f"{what}: parameter {{name}}, against "
                             "torch.amp.GradScaler on the group's global batch", names)
        for step in range(case["steps"]):
            for op in trace.ops(rank, phase="scaler", step=step):
                harness.check(set(op.group) <= set(members), f"{what}: {op.describe()} ran on ranks {list(op.group)}"
                              f", outside the scaler's group {list(members)}: pass group=self.group to the "
                              "collective", rank=rank, step=step)
