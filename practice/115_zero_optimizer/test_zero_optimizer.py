"""Problem 115 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); expected values and every
assertion live here, in the test process.  What was communicated comes from the
harness's trace; memory is measured from every tensor storage alive in the rank
(``harness.memory``), wherever the ShardedOptimizer keeps it.
"""
import math

import torch
import torch.distributed as dist
from hypothesis import given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.flat_shards import (mlp_widths_with_tiny, owned_real, owned_slice, ring_wire_bytes, shard_size,
                                 states_per_element)
from testkit.models import mse, random_batches, random_mlp, shard, train_reference
from testkit.resident import resident_growth

FLOAT64 = ((torch.float64, None),)
ANY_PRECISION = ((torch.float64, None), (torch.float32, None), (torch.bfloat16, torch.float32))


@st.composite
def zero_cases(draw, min_world=1, precisions=FLOAT64, stateful=False, min_steps=1):
    optimizers = hs.optimizers()
    if stateful:
        optimizers = optimizers.filter(lambda o: states_per_element(o) > 0)
    dtype, master_dtype = draw(st.sampled_from(precisions))
    return dict(world_size=draw(hs.world_sizes(min_world)), widths=draw(mlp_widths_with_tiny()),
                stage=draw(st.sampled_from([1, 2])), local_batch=draw(st.integers(1, 3)),
                steps=draw(st.integers(min_steps, 3)), optimizer=draw(optimizers), seed=draw(hs.seeds()),
                dtype=dtype, master_dtype=master_dtype)


def _describe(case):
    master = f", master_dtype={case['master_dtype']}" if case.get("master_dtype") else ""
    ranks = f"{case['world_size']} rank{'s' if case['world_size'] > 1 else ''}"
    return f"stage={case['stage']}, {case['optimizer']}, {ranks}{master}"


def _train(target, widths, stage, local_batch, steps, optimizer, seed, dtype=torch.float64, master_dtype=None,
           start=0, resume=None, measure=False, held_bound=None, save=False):
    """Runs on every rank: the same model on every rank, local batches, ShardedOptimizer, steps start..steps-1.

    With ``held_bound`` (bytes), also measures the tensor storage the ShardedOptimizer keeps after the last step.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model = random_mlp(widths, seed, dtype=dtype)
    if resume is not None:
        with torch.no_grad():
            for p, saved in zip(model.parameters(), resume["params"]):
                p.copy_(saved)
    # every storage alive before construction (held, so no later allocation can take one's address)
    before = harness.live_storages(collect=False) if held_bound is not None else None
    with harness.phase("construct"):
        opt = target.load().ShardedOptimizer(model.parameters(), optimizer.cls, stage=stage,
                                             master_dtype=master_dtype, **optimizer.kwargs)
    if resume is not None:
        with harness.phase("load_state_dict"):
            opt.load_state_dict(resume["states"][rank])
    batches = random_batches(steps, local_batch * world, widths[0], widths[-1], seed + 1, dtype=dtype)
    history = []
    for step in range(start, steps):
        x, y = batches[step]
        with harness.phase("train", step=step):
            opt.zero_grad()
            mse(model(shard(x, rank, world)), shard(y, rank, world)).backward()
            opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    out = {"history": history}
    if held_bound is not None:
        # What the ShardedOptimizer keeps, wherever it keeps it: every storage alive now, less what existed before
        # construction and what this function holds (the model's params and gradients, the data, the history).
        # Storages of 8 bytes or less are the optimizers' step counters, and are not counted.
        params = list(model.parameters())
        held = harness.live_storages(exclude=[before, params, [p.grad for p in params], batches, history],
                                     larger_than=8, accept=held_bound)
        out["held_bytes"], out["held"] = held.nbytes, held.describe()
    if measure:
        local = opt.local_optimizer
        out["local_type"] = type(local).__name__
        out["local_is_optimizer"] = isinstance(local, torch.optim.Optimizer)
        out["local_params"] = [p.detach().clone() for g in getattr(local, "param_groups", []) for p in g["params"]]
        out["grad_bytes"] = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
                                if p.grad is not None)
    if save:
        with harness.phase("state_dict"):
            out["state"] = opt.state_dict()
    return out


def _run(target, case, **extra):
    args = {k: v for k, v in case.items() if k != "world_size"}
    # a measurement walks every object in the rank (0.1 s or more a rank, and a full garbage collection when
    # anything is left to report)
    timeout = 30 if extra.get("held_bound") is not None else None
    return harness.run(_train, case["world_size"], target, **args, **extra, timeout=timeout)


def _expected(case):
    model = random_mlp(case["widths"], case["seed"])
    batches = random_batches(case["steps"], case["local_batch"] * case["world_size"], case["widths"][0],
                             case["widths"][-1], case["seed"] + 1)
    return [n for n, _ in model.named_parameters()], train_reference(model, batches, case["optimizer"])


def _compare_history(history, expected, names, what, rank, first_step=0):
    for step, (got_params, want_params) in enumerate(zip(history, expected), first_step):
        for name, got, want in zip(names, got_params, want_params):
            harness.assert_close(got, want, f"parameter {name} after {what}", rank=rank, step=step,
                                 atol=1e-9, rtol=1e-7)


# ---- numerics -----------------------------------------------------------------------------------

@hs.fewer_examples(0.5)
@given(zero_cases())
def test_matches_single_process_training(target, case):
    values, _ = _run(target, case)
    names, expected = _expected(case)
    for rank, out in enumerate(values[1:], 1):
        _compare_history(out["history"], values[0]["history"], names,
                         f"ShardedOptimizer({_describe(case)}), against rank 0's copy (after step() every rank "
                         "must hold the same full parameters: all_gather every rank's updated shard)", rank)
    for rank, out in enumerate(values):
        _compare_history(out["history"], expected, names, f"ShardedOptimizer({_describe(case)})", rank)


def _master_params(shapes, seed):
    """Drawn on the CPU (one generator, the same numbers everywhere), handed over on ``harness.device()``."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=gen, device="cpu") * 0.5).to(harness.device(), torch.bfloat16)
            for shape in shapes]


def _master_grad(shape, seed, step, rank):
    """Multiples of 1/8 in [-1, 1]: every sum over ranks is exact in bfloat16, so only the averaging rounds."""
    gen = torch.Generator().manual_seed(seed * 1009 + step * 31 + rank)
    grad = torch.randint(-8, 9, shape, generator=gen, device="cpu").float() / 8
    return grad.to(harness.device(), torch.bfloat16)


def _master_train(target, shapes, stage, steps, optimizer, seed):
    rank = dist.get_rank()
    params = [torch.nn.Parameter(p) for p in _master_params(shapes, seed)]
    opt = target.load().ShardedOptimizer(params, optimizer.cls, stage=stage, master_dtype=torch.float32,
                                         **optimizer.kwargs)
    history = []
    for step in range(steps):
        opt.zero_grad()
        for i, p in enumerate(params):
            p.grad = _master_grad(p.shape, seed + i, step, rank)
        with harness.phase("train", step=step):
            opt.step()
        history.append([p.detach().clone() for p in params])
    local = opt.local_optimizer
    return {"history": history,
            "local_dtypes": [str(p.dtype) for g in local.param_groups for p in g["params"]],
            "state_dtypes": sorted({str(v.dtype) for s in local.state.values() for v in s.values()
                                    if isinstance(v, torch.Tensor) and v.dim() > 0})}


@st.composite
def master_cases(draw):
    shapes = draw(st.lists(hs.shapes(max_dims=2, max_side=5), min_size=1, max_size=3)
                  .filter(lambda ss: sum(math.prod(s) for s in ss) > 0))
    return dict(world_size=draw(hs.world_sizes()), shapes=shapes, stage=draw(st.sampled_from([1, 2])),
                steps=draw(st.integers(1, 3)), optimizer=draw(hs.optimizers()), seed=draw(hs.seeds()))


@hs.fewer_examples(0.5)
@given(master_cases())
def test_bf16_params_with_fp32_master(target, case):
    n, steps, optimizer = case["world_size"], case["steps"], case["optimizer"]
    values, _ = harness.run(_master_train, n, target, case["shapes"], case["stage"], steps, optimizer, case["seed"])
    # the reference does the same casts: an fp32 master, the averaged bf16 gradient, params cast back to bf16
    master = [p.float().requires_grad_() for p in _master_params(case["shapes"], case["seed"])]
    opt = optimizer.build(master)
    expected = []
    for step in range(steps):
        for i, p in enumerate(master):
            p.grad = sum(_master_grad(p.shape, case["seed"] + i, step, r).double() for r in range(n)).float() / n
        opt.step()
        expected.append([p.detach().to(torch.bfloat16) for p in master])
    lr = optimizer.kwargs["lr"]
    what = f"bfloat16 parameter {{}} after ShardedOptimizer(stage={case['stage']}, {optimizer}, master_dtype=float32)"
    for rank, out in enumerate(values):
        harness.check(set(out["local_dtypes"]) == {"torch.float32"},
                      f"local_optimizer's parameters are {sorted(set(out['local_dtypes']))}: with bfloat16 params "
                      "and master_dtype=torch.float32 the shard must keep its master copy in float32", rank=rank)
        harness.check(set(out["state_dtypes"]) <= {"torch.float32"},
                      f"local_optimizer's state tensors are {out['state_dtypes']}: the optimizer must run on the "
                      "float32 master shard", rank=rank)
        for step, (got_params, want_params) in enumerate(zip(out["history"], expected)):
            for i, (got, want) in enumerate(zip(got_params, want_params)):
                # within bfloat16 rounding: two units in the last place, plus the averaging's rounding carried by lr
                harness.assert_close(got, want, what.format(i), rank=rank, step=step, rtol=2 ** -6,
                                     atol=lr * (step + 1) * 2 ** -6)


# ---- memory -------------------------------------------------------------------------------------

@hs.fewer_examples(0.5)
@given(zero_cases(precisions=ANY_PRECISION))
def test_optimizer_state_is_sharded(target, case):
    n, optimizer = case["world_size"], case["optimizer"]
    model = random_mlp(case["widths"], 0)
    numel = sum(p.numel() for p in model.parameters())
    s = shard_size(numel, n)
    master = case["master_dtype"] or case["dtype"]
    element = torch.empty(0, dtype=master).element_size()
    states = states_per_element(optimizer)
    # the master shard, its gradient, and the optimizer's per-element state: each S elements of the master dtype
    bound = s * element * (2 + states)
    values, _ = _run(target, case, measure=True, held_bound=bound)
    for rank, out in enumerate(values):
        harness.check(out["local_is_optimizer"],
                      "local_optimizer must be a torch.optim.Optimizer over this rank's shard, got "
                      f"{out['local_type']}",
                      rank=rank)
        local = out["local_params"]
        held = sum(p.numel() for p in local)
        harness.check(held <= s,
                      f"local_optimizer holds {held} parameter elements; with P={numel} elements over {n} ranks "
                      f"each rank's shard has S=ceil(P/N)={s}: the optimizer is not sharded", rank=rank)
        harness.check(all(p.dtype == master for p in local),
                      f"local_optimizer's parameters are {sorted({str(p.dtype) for p in local})}, expected the "
                      f"master dtype {master}", rank=rank)
        real = owned_real(numel, n, rank)
        got = torch.cat([p.reshape(-1) for p in local])[:real].to(case["dtype"]) if local else torch.zeros(0)
        final = out["history"][-1]
        harness.assert_close(got, owned_slice(final, n, rank)[:real],
                             f"local_optimizer's parameters (concatenated) against this rank's slice "
                             f"[{rank * s}, {rank * s + real}) of the flattened parameters", rank=rank, exact=True)
        harness.check(out["held_bytes"] <= bound,
                      f"after step() this rank holds {out['held_bytes']} bytes of tensor storage beyond the model's "
                      f"parameters and gradients: {out['held']}.  A shard of S={s} {master} elements needs at most "
                      f"S x {element} x (1 master + 1 gradient + {states} state) = {bound} bytes ({optimizer} keeps "
                      f"{states} state value(s) per element); a view into a full-size buffer costs the whole buffer: "
                      f"the master copy or the optimizer state is not sharded ({_describe(case)}, P={numel})",
                      rank=rank)


RESIDENT_WIDTHS = [1024, 1024, 1024]   # P = 2.1M float32 elements, 8 MiB: far above a page, and above the slack


def _trained(target, stage, optimizer):
    """Runs on every rank: two steps of ShardedOptimizer on a large float32 MLP, which stays held."""
    rank = dist.get_rank()
    model = random_mlp(RESIDENT_WIDTHS, 0, dtype=torch.float32)
    opt = target.load().ShardedOptimizer(model.parameters(), optimizer.cls, stage=stage, **optimizer.kwargs)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(2):
        opt.zero_grad()
        x = torch.randn(2, RESIDENT_WIDTHS[0], generator=gen, device="cpu").to(harness.device())
        mse(model(x), torch.zeros(2, RESIDENT_WIDTHS[-1], device=harness.device())).backward()
        opt.step()
    harness.hold(model, opt)


@hs.fewer_examples(0.04, minimum=2)
@given(st.integers(2, 4), st.sampled_from([1, 2]), hs.optimizers().filter(lambda o: states_per_element(o) >= 2))
def test_resident_memory_holds_only_a_shard_of_the_state(target, world_size, stage, optimizer):
    numel = sum(p.numel() for p in random_mlp(RESIDENT_WIDTHS, 0, dtype=torch.float32).parameters())
    full, s = numel * 4, shard_size(numel, world_size)
    shard = s * 4 * (2 + states_per_element(optimizer))
    bound = 2 * full + shard + full // 2   # the params, full gradients, the shard's master, gradient and state; slack
    for rank, grew in enumerate(resident_growth(_trained, world_size, target, stage, optimizer)):
        harness.check(grew <= bound,
                      f"the kernel counts {grew} more bytes resident in this rank after two steps (the test process "
                      f"read it from /proc), while the model's parameters and gradients ({2 * full} bytes) and a "
                      f"shard of S={s} float32 elements with its gradient and {optimizer} state ({shard} bytes) "
                      f"need {2 * full + shard}, with {full // 2} to spare: state is kept outside torch tensors "
                      f"(numpy, ctypes, mmap), unsharded (stage={stage}, {world_size} ranks, P={numel})", rank=rank)


@hs.fewer_examples(0.3)
@given(zero_cases(min_world=2, precisions=ANY_PRECISION).filter(lambda c: c["stage"] == 2))
def test_stage2_keeps_only_a_gradient_shard(target, case):
    values, _ = _run(target, case, measure=True)
    numel = sum(p.numel() for p in random_mlp(case["widths"], 0).parameters())
    s = shard_size(numel, case["world_size"])
    master = case["master_dtype"] or case["dtype"]
    bound = s * torch.empty(0, dtype=master).element_size()
    for rank, out in enumerate(values):
        local_grads = sum(p.grad.numel() * p.grad.element_size() for p in out["local_params"] if p.grad is not None)
        harness.check(out["grad_bytes"] == 0,
                      f"after step() the model's parameters still hold {out['grad_bytes']} bytes of full gradients: "
                      "stage 2 shards the gradients, so step() must release the full ones (set .grad to None) "
                      "once they are reduce-scattered", rank=rank)
        harness.check(local_grads <= bound,
                      f"the shard's gradients hold {local_grads} bytes after step(); a shard of S={s} {master} "
                      f"elements needs {bound}", rank=rank)


# ---- communication ------------------------------------------------------------------------------

@hs.fewer_examples(0.5)
@given(zero_cases(min_world=2, precisions=ANY_PRECISION))
def test_collective_kinds_match_the_stage(target, case):
    _, trace = _run(target, case)
    want = {1: ["all_gather", "all_reduce"], 2: ["all_gather", "reduce_scatter"]}[case["stage"]]
    why = {1: "stage 1 all_reduces the gradients and all_gathers the updated parameters",
           2: "stage 2 reduce_scatters the gradients (each rank receives only its slice) and all_gathers the "
              "updated parameters; it never all_reduces"}[case["stage"]]
    for rank in range(case["world_size"]):
        for step in range(case["steps"]):
            ops = trace.ops(rank, step=step)
            kinds = sorted({op.kind for op in ops})
            harness.check(kinds == want,
                          f"one training step issued {[op.describe() for op in ops]}: {why} "
                          f"({_describe(case)})", rank=rank, step=step)


@hs.fewer_examples(0.5)
@given(zero_cases(min_world=2, precisions=ANY_PRECISION))
def test_bytes_per_step_match_ring_costs(target, record_property, case):
    _, trace = _run(target, case)
    n, stage = case["world_size"], case["stage"]
    numel = sum(p.numel() for p in random_mlp(case["widths"], 0).parameters())
    s = shard_size(numel, n)
    e = torch.empty(0, dtype=case["dtype"]).element_size()
    # the cost model, per rank per step (the statement's concept section): what the trace records each rank
    # contributing, and what a ring puts on the wire for it; stage 1's all_reduce may take P or N·S elements,
    # so its model follows the one rank 0's first step chose (the check below holds every rank to the two)
    reduced = sum(op.in_bytes for op in trace.ops(0, "all_reduce", step=0)) // e
    reduced = numel if stage == 2 or reduced != n * s else reduced
    model = {1: ((reduced + s) * e, "(P or N·S) · elem_size + S · elem_size",
                 (2 * (n - 1) / n * reduced + (n - 1) * s) * e,
                 "(2(N-1)/N · (P or N·S) + (N-1) · S) · elem_size"),
             2: ((n + 1) * s * e, "(N+1) · S · elem_size", 2 * (n - 1) * s * e, "2(N-1) · S · elem_size")}[stage]
    figures = {}
    for rank in range(n):
        for step in range(case["steps"]):
            ops = trace.ops(rank, step=step)
            sent = {k: sum(op.in_bytes for op in ops if op.kind == k)
                    for k in ("all_reduce", "reduce_scatter", "all_gather")}
            listing = f"{[op.describe() for op in ops]} ({_describe(case)}, P={numel}, S={s})"
            what = f"bytes per rank (stage {stage}) in the cost model: {model[1]} = {model[0]}"
            harness.check(sent["all_gather"] == s * e,
                          f"the all_gather carried {sent['all_gather']} bytes from this rank; each rank contributes "
                          f"exactly its S={s} updated elements in the parameters' dtype ({s * e} bytes; {what}): "
                          f"{listing}", rank=rank, step=step)
            if stage == 2:
                harness.check(sent["reduce_scatter"] == n * s * e,
                              f"the reduce_scatter input was {sent['reduce_scatter']} bytes; it is the whole "
                              f"gradient padded to N*S={n * s} elements in the parameters' dtype "
                              f"({n * s * e} bytes; {what}): {listing}", rank=rank, step=step)
                want_wire = model[2]
            else:
                harness.check(sent["all_reduce"] in (numel * e, n * s * e),
                              f"the all_reduce carried {sent['all_reduce']} bytes; it is the whole gradient in the "
                              f"parameters' dtype, {numel * e} bytes (or {n * s * e} padded; {what}): {listing}",
                              rank=rank, step=step)
                want_wire = 2 * (n - 1) / n * sent["all_reduce"] + (n - 1) * s * e
            wire = sum(ring_wire_bytes(op.kind, op.in_bytes, n) for op in ops)
            harness.check(math.isclose(wire, want_wire),
                          f"on a ring this step puts {wire:g} bytes on the wire from this rank, but ring bytes per "
                          f"rank (stage {stage}) in the cost model is {model[3]} = {want_wire:g}"
                          f"{' (the all_reduce as issued)' if stage == 1 else ''}: {listing}", rank=rank, step=step)
            figures[rank, step] = (sum(sent.values()), wire)
    busiest = max(figures.values())
    cost.record(record_property, f"stage {stage}, P={numel} {case['dtype']} elements on {n} ranks (S={s})",
                numel * e * (n - 1) / n, **{f"bytes per rank (stage {stage})": (model[0], busiest[0]),
                                            f"ring bytes per rank (stage {stage})": (model[2], busiest[1])})


# ---- checkpoints --------------------------------------------------------------------------------

@st.composite
def resume_cases(draw):
    case = draw(zero_cases(stateful=True, min_steps=2))
    case["resume_at"] = draw(st.integers(1, case["steps"] - 1))
    return case


@hs.fewer_examples(0.3)
@given(resume_cases())
def test_state_dict_round_trip(target, case):
    j = case.pop("resume_at")
    first, _ = _run(target, dict(case, steps=j), save=True)   # steps 0..j-1 (the batches are drawn in order)
    resume = {"params": first[0]["history"][-1], "states": [out["state"] for out in first]}
    second, _ = _run(target, case, start=j, resume=resume)
    names, expected = _expected(case)
    for rank, out in enumerate(second):
        _compare_history(out["history"], expected[j:], names,
                         f"saving with state_dict() after step {j - 1} and resuming with load_state_dict() in a "
                         f"fresh ShardedOptimizer ({_describe(case)})", rank, first_step=j)


def _bad_inputs(target):
    """Each bad construction, and what the rank saw: (case, exception type, message)."""
    m = target.load()
    here = harness.device()
    good = [torch.nn.Parameter(torch.zeros(3, device=here)), torch.nn.Parameter(torch.zeros(2, device=here))]
    cases = {
        "stage=0": (good, dict(stage=0)),
        "stage=3": (good, dict(stage=3)),
        "params of dtypes float32 and float64": (
            [torch.nn.Parameter(torch.zeros(3, device=here)),
             torch.nn.Parameter(torch.zeros(2, dtype=torch.float64, device=here))], {}),
        f"params on devices {here.type} and meta": (
            [torch.nn.Parameter(torch.zeros(3, device=here)), torch.nn.Parameter(torch.zeros(2, device="meta"))], {}),
    }
    seen = []
    for name, (params, kwargs) in cases.items():
        try:
            m.ShardedOptimizer(params, torch.optim.SGD, lr=0.1, **kwargs)
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 -- reported back to the test process
            seen.append((name, type(e).__name__, str(e)))
        else:
            seen.append((name, None, ""))
    return seen


def test_bad_input_raises_value_error(target):
    seen = harness.run(_bad_inputs, 2, target).values[0]
    for name, kind, message in seen:
        word = "stage" if name.startswith("stage") else "dtype" if "dtypes" in name else "device"
        harness.check(kind is not None, f"ShardedOptimizer with {name} was accepted; it must raise ValueError")
        harness.check(kind == "ValueError",
                      f"ShardedOptimizer with {name} raised {kind}: {message!r}; it must raise ValueError")
        harness.check(word in message.lower(),
                      f"ShardedOptimizer with {name} raised ValueError({message!r}); a clear message names the "
                      f"{word}")


# ---- a second oracle: torch's own ZeroRedundancyOptimizer ---------------------------------------

def _torch_zero_train(widths, local_batch, steps, optimizer, seed):
    """torch.distributed.optim.ZeroRedundancyOptimizer on the same ranks, gradients averaged as DDP would."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    rank, world = dist.get_rank(), dist.get_world_size()
    model = random_mlp(widths, seed)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer.cls, **optimizer.kwargs)
    history = []
    for x, y in random_batches(steps, local_batch * world, widths[0], widths[-1], seed + 1):
        opt.zero_grad(set_to_none=True)
        mse(model(shard(x, rank, world)), shard(y, rank, world)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return {"history": history}


@hs.fewer_examples(0.2)
@given(zero_cases(min_world=2))
def test_matches_torch_zero_redundancy_optimizer(target, case):
    values, _ = _run(target, case)
    # trusted torch code: a longer limit covers the first import of torch.distributed.optim in each rank
    oracle, _ = harness.run(_torch_zero_train, case["world_size"], case["widths"], case["local_batch"],
                            case["steps"], case["optimizer"], case["seed"], timeout=60)
    names = [n for n, _ in random_mlp(case["widths"], 0).named_parameters()]
    for rank, (out, want) in enumerate(zip(values, oracle)):
        _compare_history(out["history"], want["history"], names,
                         f"ShardedOptimizer({_describe(case)}) against torch's ZeroRedundancyOptimizer", rank)
