"""Problem 116 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); expected values and every
assertion live here, in the test process.  What was communicated comes from the
harness's trace; who holds full parameters is observed by hooks the test installs,
and what memory stays alive is measured from every tensor storage in the rank and
every tensor autograd saved (``harness.memory``), wherever the code keeps them.
"""
import math
from contextlib import nullcontext

import torch
import torch.distributed as dist
from hypothesis import given, strategies as st

import harness
from testkit import strategies as hs
from testkit.flat_shards import mlp_widths_with_tiny, owned_slice, ring_wire_bytes, shard_size, unflatten
from testkit.models import mse, random_batches, random_mlp, shard, train_reference
from testkit.resident import resident_growth


@st.composite
def fsdp_cases(draw, min_world=1, max_steps=3, micro_batches=st.just(1)):
    return dict(world_size=draw(hs.world_sizes(min_world)), widths=draw(mlp_widths_with_tiny()),
                local_batch=draw(st.integers(1, 3)), steps=draw(st.integers(1, max_steps)),
                optimizer=draw(hs.optimizers()), seed=draw(hs.seeds()), micro_batches=draw(micro_batches))


def _describe(case):
    n, k = case["world_size"], case.get("micro_batches", 1)
    accumulate = f", {k} backward passes per step" if k > 1 else ""
    return f"widths={case['widths']}, {case['optimizer']}, {n} rank{'s' if n > 1 else ''}{accumulate}"


def _layout(model):
    """Per child with parameters: (child index, [(name, shape)], P) -- what the test knows about the units."""
    out = []
    for i, child in enumerate(model):
        named = [(n, tuple(p.shape)) for n, p in child.named_parameters()]
        if named:
            out.append((i, named, sum(math.prod(s) for _, s in named)))
    return out


def _holders(units, layout, active=None):
    """(unit, name, shape, bytes) for each unit other than ``active`` whose attribute holds a full parameter."""
    found = []
    for i, named, _ in layout:
        if i == active:
            continue
        for name, shape in named:
            t = getattr(units[i], name, None)
            if isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.untyped_storage().nbytes() > 0:
                found.append((i, type(units[i]).__name__, name, shape, t.untyped_storage().nbytes()))
                break
    return found


def _watch(units, layout, seen):
    """Hooks that record, at every forward/backward boundary of every unit, which OTHER units hold full params."""
    def note(event, unit=None):
        for holder in _holders(units, layout, active=unit):
            if len(seen) < 5:
                seen.append((event, holder))

    for i, unit in enumerate(units):
        label = f"unit {i} ({type(unit).__name__})"
        unit.register_forward_pre_hook(lambda m, a, i=i, s=label: note(f"just before {s} runs forward", i))
        unit.register_forward_hook(lambda m, a, o, i=i, s=label: note(f"just after {s}'s forward", i))
        unit.register_full_backward_pre_hook(lambda m, g, i=i, s=label: note(f"as {s}'s backward begins", i))
        unit.register_full_backward_hook(lambda m, gi, go, i=i, s=label: note(f"as {s}'s backward ends", i))
    return note


def _record_activations(units, seen):
    """Hooks that keep every unit's input and output tensors: the activations, which backward needs alive."""
    for unit in units:
        unit.register_forward_pre_hook(lambda m, args: seen.extend(a for a in args if isinstance(a, torch.Tensor)))
        unit.register_forward_hook(lambda m, args, output: seen.append(output))


def generator_states():
    """This rank's random-number generator states, as torch.utils.checkpoint saves them for each region it will
    recompute (preserve_rng_state): the CPU generator's and, on a GPU, the device's.  No parameter is in them."""
    states = [torch.get_rng_state()]
    if harness.device().type == "cuda":
        states.append(torch.cuda.get_rng_state(harness.device()))
    return states


def _copies_of(held, states) -> list:
    """The storages among ``held`` whose bytes are exactly one of ``states``."""
    def copies(h):
        if str(h.storage.device) != "cpu" or h.nbytes not in {t.numel() for t in states}:
            return False
        content = torch.empty(0, dtype=torch.uint8).set_(h.storage)
        return any(torch.equal(content, t) for t in states if t.numel() == h.nbytes)
    return [h.storage for h in held.values() if copies(h)]


def _still_held(when, before, exclude, saved=None, states=()):
    """(when, bytes, description) of the storages alive now that were not before, less ``exclude`` and less
    copies of the generator ``states`` taken before the pass.

    Every storage in the rank counts (found through gc: attributes, closures, dicts, ...), and so does
    every storage autograd saved for backward in ``saved`` (C++ holds those, out of gc's sight).
    """
    held = harness.live_storages(exclude=[before, exclude])
    held = held.without(_copies_of(held, states))
    words = held.describe()
    if saved is not None:
        only_saved = saved.storages(exclude=[before, exclude, held])
        held = held | only_saved
        if only_saved:
            words += f"; held only by autograd, saved for backward: {only_saved.describe()}"
    return when, held.nbytes, words


def _train(target, widths, local_batch, steps, optimizer, seed, micro_batches=1, watch=False, full_state=False,
           measure=False):
    """Runs on every rank: wrap the same model on every rank, train on local batches, report the shards.

    Each step runs ``micro_batches`` forward and backward passes, then one optimizer step.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model = random_mlp(widths, seed)
    units, layout = list(model), _layout(model)
    with harness.phase("construct"):
        fsdp = target.load().FullyShardedModel(model)
    out = {"initial": [p.detach().clone() for p in fsdp.parameters()], "history": [], "grads": [], "held": [],
           "memory": []}
    note = _watch(units, layout, out["held"]) if watch else (lambda event, unit=None: None)
    activations = []
    if measure:
        _record_activations(units, activations)
    note("after construction")
    opt = optimizer.build(fsdp.parameters())
    batches = random_batches(steps * micro_batches, local_batch * world, widths[0], widths[-1], seed + 1)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        for micro, (x, y) in enumerate(batches[step * micro_batches:(step + 1) * micro_batches]):
            when = f"step {step}" + (f", backward pass {micro + 1} of {micro_batches}" if micro_batches > 1 else "")
            activations.clear()
            states = generator_states() if measure else ()
            # held, so no storage allocated later can reuse an address and pass for one of these
            before = harness.live_storages(collect=False) if measure else None
            with harness.phase("forward", step=step), (harness.saved_for_backward() if measure else nullcontext()) \
                    as saved:
                prediction = fsdp(shard(x, rank, world))
            note(f"{when}: after the forward returned")
            shards = list(fsdp.parameters())
            if measure:
                out["memory"].append(_still_held(f"{when}: after the forward returned, before backward", before,
                                                 [activations, prediction, shards], saved, states))
            loss = mse(prediction, shard(y, rank, world))
            with harness.phase("backward", step=step):
                loss.backward()
            note(f"{when}: after loss.backward() returned")
            if measure:
                out["memory"].append(_still_held(f"{when}: after loss.backward() returned", before,
                                                 [activations, prediction, loss, shards, [p.grad for p in shards]],
                                                 saved, states))
        out["grads"].append([None if p.grad is None else p.grad.detach().clone() for p in fsdp.parameters()])
        opt.step()
        out["history"].append([p.detach().clone() for p in fsdp.parameters()])
    if full_state:
        with harness.phase("full_state_dict"):
            out["state"] = fsdp.full_state_dict()
        note("after full_state_dict()")
    return out


def _run(target, case, **extra):
    args = {k: v for k, v in case.items() if k != "world_size"}
    # a measurement walks every object in the rank (0.1 s or more a rank, and a full garbage collection when
    # anything is left to report)
    timeout = 60 if extra.get("measure") else None
    return harness.run(_train, case["world_size"], target, **args, **extra, timeout=timeout)


def _check_shard_shapes(params, layout, n, rank):
    """parameters() must be exactly one flat shard of S_u = ceil(P_u / N) elements per unit with parameters."""
    want = [(shard_size(numel, n),) for _, _, numel in layout]
    got = [tuple(p.shape) for p in params]
    units = ", ".join(f"unit {i}: P={numel}" for i, _, numel in layout)
    harness.check(got == want,
                  f"parameters() are shaped {got}; it must expose exactly one flat shard per unit with parameters, "
                  f"of S = ceil(P/N) elements each: {want} ({units}, N={n})", rank=rank)


def _assemble(values, layout, n, step=None, key="history"):
    """The full parameters (or, with key="grads", gradients), unit by unit, from every rank's shards.

    Rank r's shard is elements [r*S, (r+1)*S) of the unit's flat, padded vector.
    """
    full = []
    for u, (_, named, numel) in enumerate(layout):
        shards = [out["initial"][u] if step is None else out[key][step][u] for out in values]
        full.extend(unflatten(torch.cat(shards), [s for _, s in named]))
    return full


# ---- numerics -----------------------------------------------------------------------------------

@hs.fewer_examples(0.5)
@given(fsdp_cases())
def test_matches_single_process_training(target, case):
    values, _ = _run(target, case)
    n = case["world_size"]
    model = random_mlp(case["widths"], case["seed"])
    layout = _layout(model)
    names = [n for n, _ in model.named_parameters()]
    expected = train_reference(model, random_batches(case["steps"], case["local_batch"] * n, case["widths"][0],
                                                     case["widths"][-1], case["seed"] + 1), case["optimizer"])
    for rank, out in enumerate(values):
        for params in out["history"]:
            _check_shard_shapes(params, layout, n, rank)
    for step, want_params in enumerate(expected):
        got_params = _assemble(values, layout, n, step)
        for name, got, want in zip(names, got_params, want_params):
            harness.assert_close(got, want, f"parameter {name}, reassembled from every rank's shard, with the "
                                 f"optimizer on FullyShardedModel.parameters() ({_describe(case)})",
                                 step=step, atol=1e-9, rtol=1e-7)


@hs.fewer_examples(0.5)
@given(fsdp_cases())
def test_full_state_dict_matches_reference(target, case):
    values, _ = _run(target, case, full_state=True)
    n = case["world_size"]
    model = random_mlp(case["widths"], case["seed"])
    train_reference(model, random_batches(case["steps"], case["local_batch"] * n, case["widths"][0],
                                          case["widths"][-1], case["seed"] + 1), case["optimizer"])
    want = model.state_dict()
    for rank, out in enumerate(values):
        got = out["state"]
        harness.check(isinstance(got, dict) and list(got) == list(want),
                      f"full_state_dict() has keys {list(got) if isinstance(got, dict) else type(got).__name__}; "
                      f"it must have module.state_dict()'s keys, in order: {list(want)}", rank=rank)
        for key, value in want.items():
            harness.assert_close(got[key], value, f"full_state_dict()[{key!r}] after {case['steps']} step(s) "
                                 f"({_describe(case)})", rank=rank, atol=1e-9, rtol=1e-7)


def _accumulating_reference(case):
    """Single process, full batches: k backward passes per step (the gradients add up in .grad), then one step.

    Returns the parameter names, the gradients just before each step, and the parameters after it.
    """
    n, k = case["world_size"], case["micro_batches"]
    model = random_mlp(case["widths"], case["seed"])
    opt = case["optimizer"].build(model.parameters())
    batches = random_batches(case["steps"] * k, case["local_batch"] * n, case["widths"][0], case["widths"][-1],
                             case["seed"] + 1)
    grads, history = [], []
    for step in range(case["steps"]):
        opt.zero_grad(set_to_none=True)
        for x, y in batches[step * k:(step + 1) * k]:
            mse(model(x), y).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return [name for name, _ in model.named_parameters()], grads, history


@hs.fewer_examples(0.3)
@given(fsdp_cases(max_steps=2, micro_batches=st.integers(2, 3)))
def test_backward_passes_accumulate_into_shard_grads(target, case):
    values, _ = _run(target, case)
    n, k = case["world_size"], case["micro_batches"]
    layout = _layout(random_mlp(case["widths"], 0))
    names, grads, history = _accumulating_reference(case)
    for step in range(case["steps"]):
        for rank, out in enumerate(values):
            missing = [i for (i, _, _), g in zip(layout, out["grads"][step]) if g is None]
            harness.check(not missing, f"after {k} backward passes the shards of units {missing} have no .grad "
                                       f"({_describe(case)})", rank=rank, step=step)
        for name, got, want in zip(names, _assemble(values, layout, n, step, key="grads"), grads[step]):
            harness.assert_close(got, want, f"gradient of {name}, reassembled from every rank's shard .grad after "
                                 f"{k} backward passes without zero_grad (each backward adds its reduce-scattered "
                                 f"gradient to the .grad already there, as torch does) ({_describe(case)})",
                                 step=step, atol=1e-9, rtol=1e-7)
        for name, got, want in zip(names, _assemble(values, layout, n, step), history[step]):
            harness.assert_close(got, want, f"parameter {name}, reassembled from every rank's shard, after one "
                                 f"optimizer step on gradients accumulated over {k} backward passes "
                                 f"({_describe(case)})", step=step, atol=1e-9, rtol=1e-7)


# ---- memory -------------------------------------------------------------------------------------

@hs.fewer_examples(0.5)
@given(fsdp_cases())
def test_parameters_are_flat_padded_shards(target, case):
    values, _ = _run(target, dict(case, steps=1))
    n = case["world_size"]
    model = random_mlp(case["widths"], case["seed"])
    layout = _layout(model)
    children = list(model)
    for rank, out in enumerate(values):
        _check_shard_shapes(out["initial"], layout, n, rank)
        for (i, named, numel), got in zip(layout, out["initial"]):
            want = owned_slice(list(children[i].parameters()), n, rank)
            s = want.numel()
            harness.assert_close(got.detach(), want,
                                 f"unit {i}'s shard right after construction: elements [{rank * s}, {(rank + 1) * s}) "
                                 f"of its {numel} parameters {[name for name, _ in named]} flattened in order and "
                                 f"zero-padded to N*S={n * s}", rank=rank, exact=True)


@hs.fewer_examples(0.5)
@given(fsdp_cases())
def test_no_unit_holds_full_parameters_outside_its_own_pass(target, case):
    values, _ = _run(target, case, watch=True, full_state=True)
    for rank, out in enumerate(values):
        for event, (unit, kind, name, shape, nbytes) in out["held"][:1]:
            harness.check(False, f"{event}, unit {unit} ({kind}) holds its full parameter {name!r} of shape "
                                 f"{shape} ({nbytes} bytes of storage): outside its own forward and backward a unit "
                                 "keeps only its 1/N shard; free the full parameters right after each use "
                                 f"({_describe(case)})", rank=rank)


@hs.fewer_examples(0.3)
@given(fsdp_cases(max_steps=2, micro_batches=st.integers(1, 2)))
def test_gathered_parameters_do_not_stay_alive(target, case):
    values, _ = _run(target, case, measure=True)
    for rank, out in enumerate(values):
        for when, nbytes, held in out["memory"]:
            harness.check(nbytes == 0,
                          f"{when}, this rank holds {nbytes} bytes of tensor storage that the pass created: {held}.  "
                          "Beyond the activations (each unit's input and output), the shards and their gradients "
                          "(and the random-number states torch.utils.checkpoint keeps), nothing may outlive a "
                          "unit's forward or backward: free the gathered full parameters' "
                          "storage (untyped_storage().resize_(0)), do not just drop them from the unit's "
                          "attributes; the views of them that autograd saved for backward, and any tensor your "
                          "code keeps, are counted wherever they are held "
                          f"({_describe(case)})", rank=rank)


RESIDENT_WIDTHS = [1024, 1024, 1024]   # P = 2.1M float32 elements, 8 MiB: far above a page, and above the slack


def _trained_and_held(target):
    """Runs on every rank: wrap a large float32 MLP, one SGD step; the wrapper and the optimizer stay held."""
    rank = dist.get_rank()
    fsdp = target.load().FullyShardedModel(random_mlp(RESIDENT_WIDTHS, 0, dtype=torch.float32))
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.1)
    x = torch.randn(2, RESIDENT_WIDTHS[0], generator=torch.Generator().manual_seed(rank), device="cpu").to(harness.device())
    mse(fsdp(x), torch.zeros(2, RESIDENT_WIDTHS[-1], device=harness.device())).backward()
    opt.step()
    harness.hold(fsdp, opt)


@hs.fewer_examples(0.04, minimum=2)
@given(st.integers(2, 4))
def test_resident_memory_holds_only_shards(target, world_size):
    layers = [(o * i + o) for i, o in zip(RESIDENT_WIDTHS[:-1], RESIDENT_WIDTHS[1:])]
    shards = sum(shard_size(numel, world_size) for numel in layers) * 4
    full = sum(layers) * 4
    bound = 2 * shards + full // 2   # each unit's shard and its gradient; slack
    for rank, grew in enumerate(resident_growth(_trained_and_held, world_size, target)):
        harness.check(grew <= bound,
                      f"the kernel counts {grew} more bytes resident in this rank after a step (the test process "
                      f"read it from /proc), while the shards and their gradients need {2 * shards} bytes, with "
                      f"{full // 2} to spare; all the parameters are {full} bytes: full parameters are kept, outside "
                      f"torch tensors (numpy, ctypes, mmap) or in them ({world_size} ranks)", rank=rank)


# ---- communication ------------------------------------------------------------------------------

@hs.fewer_examples(0.5)
@given(fsdp_cases(min_world=2))
def test_two_all_gathers_and_one_reduce_scatter_per_unit(target, case):
    _, trace = _run(target, case)
    n = case["world_size"]
    layout = _layout(random_mlp(case["widths"], 0))
    e = torch.empty(0, dtype=torch.float64).element_size()
    shards = sorted(shard_size(numel, n) * e for _, _, numel in layout)
    for rank in range(n):
        for step in range(case["steps"]):
            for phase, want, what in (
                    ("forward", {"all_gather": shards}, "one all_gather of its shard"),
                    ("backward", {"all_gather": shards, "reduce_scatter": [n * b for b in shards]},
                     "one all_gather of its shard and one reduce_scatter of its padded gradient")):
                ops = trace.ops(rank, phase=phase, step=step)
                got = {kind: sorted(op.in_bytes for op in ops if op.kind == kind) for kind in {op.kind for op in ops}}
                sizes = ", ".join(f"{kind} inputs {b} bytes" for kind, b in want.items())
                harness.check(got == want,
                              f"the {phase} pass issued {[op.describe() for op in ops]}; per unit with parameters "
                              f"it must issue {what}, and nothing else: {sizes} ({_describe(case)})",
                              rank=rank, step=step)
            ops = trace.ops(rank, step=step)
            wire = sum(ring_wire_bytes(op.kind, op.in_bytes, n) for op in ops)
            padded = n * sum(shards)
            harness.check(math.isclose(wire, 3 * (n - 1) / n * padded),
                          f"on a ring this step puts {wire:g} bytes on the wire; 2 all_gathers and 1 reduce_scatter "
                          f"per unit make 3(N-1)/N x {padded} padded parameter bytes = "
                          f"{3 * (n - 1) / n * padded:g}", rank=rank, step=step)


# ---- a second oracle: torch's FSDP2 -------------------------------------------------------------

def _fsdp2_train(widths, local_batch, steps, optimizer, seed, micro_batches=1):
    """torch.distributed.fsdp.fully_shard on every unit with parameters, then on the root.

    FSDP2 reduce-scatters after every backward and adds the result to the sharded .grad.
    """
    from torch.distributed.fsdp import fully_shard
    rank, world = dist.get_rank(), dist.get_world_size()
    model = random_mlp(widths, seed)
    for child in model:
        if list(child.parameters()):
            fully_shard(child)
    fully_shard(model)
    opt = optimizer.build(model.parameters())
    history = []
    batches = random_batches(steps * micro_batches, local_batch * world, widths[0], widths[-1], seed + 1)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        for x, y in batches[step * micro_batches:(step + 1) * micro_batches]:
            with harness.phase("forward", step=step):
                prediction = model(shard(x, rank, world))
            loss = mse(prediction, shard(y, rank, world))
            with harness.phase("backward", step=step):
                loss.backward()
        opt.step()
        # this rank's dim-0 chunk of each parameter (full_tensor() would use untraced functional collectives)
        history.append([p.to_local().detach().clone() for p in model.parameters()])
    return {"history": history}


@hs.fewer_examples(0.2)
@given(fsdp_cases(min_world=2, micro_batches=st.integers(1, 2)))
def test_matches_torch_fsdp2(target, case):
    values, trace = _run(target, case)
    # trusted torch code: a longer limit covers the first import of torch.distributed.fsdp in each rank
    oracle, oracle_trace = harness.run(_fsdp2_train, case["world_size"], case["widths"], case["local_batch"],
                                       case["steps"], case["optimizer"], case["seed"], case["micro_batches"],
                                       timeout=60)
    model = random_mlp(case["widths"], 0)
    layout, names = _layout(model), [n for n, _ in model.named_parameters()]
    for step in range(case["steps"]):
        got_params = _assemble(values, layout, case["world_size"], step)
        fsdp2 = [torch.cat(chunks) for chunks in zip(*(out["history"][step] for out in oracle))]
        for name, got, want in zip(names, got_params, fsdp2):
            harness.assert_close(got, want, f"parameter {name} against torch's FSDP2 fully_shard ({_describe(case)})",
                                 step=step, atol=1e-9, rtol=1e-7)
        for phase in ("forward", "backward"):
            for kind in ("all_gather", "reduce_scatter"):
                got = len(trace.ops(0, kind, phase, step))
                want = len(oracle_trace.ops(0, kind, phase, step))
                harness.check(got == want, f"the {phase} pass issued {got} {kind}(s); torch's FSDP2 issues {want} "
                                           f"for the same model ({_describe(case)})", step=step)
