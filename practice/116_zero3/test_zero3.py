"""Problem 116 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); expected values and every
assertion live here, in the test process.  What was communicated comes from the
harness's trace; who holds full parameters is observed by hooks the test installs,
and what memory stays alive is measured from every tensor storage in the rank and
every tensor autograd saved (``harness.memory``), wherever the code keeps them.
Where each unit's compute starts, in each pass, is a ``harness.phase`` mark that
hooks the test installs put in the same trace, so the prefetch order is read from
the harness's clock beside the all_gathers it recorded.
"""
import math
from contextlib import nullcontext

import torch
import torch.distributed as dist
from hypothesis import example, given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.flat_shards import mlp_widths_with_tiny, owned_slice, ring_wire_bytes, shard_size, unflatten
from testkit.models import OptimizerSpec, mse, random_batches, random_mlp, shard, train_reference
from testkit.resident import resident_growth


@st.composite
def fsdp_cases(draw, min_world=1, max_steps=3, micro_batches=st.just(1), widths=None):
    return dict(world_size=draw(hs.world_sizes(min_world)), widths=draw(mlp_widths_with_tiny() if widths is None else widths),
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


def _next_unit(layout, i, direction):
    """The unit with parameters that the pass reaches after unit ``i``: the prefetched one (None at the end)."""
    later = [u for u, _, _ in layout if (u > i if direction == "forward" else u < i)]
    return (min(later) if direction == "forward" else max(later)) if later else None


def _holders(units, layout, allowed=()):
    """(unit, name, shape, bytes) for each unit not in ``allowed`` whose attribute holds a full parameter."""
    found = []
    for i, named, _ in layout:
        if i in allowed:
            continue
        for name, shape in named:
            t = getattr(units[i], name, None)
            if isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.untyped_storage().nbytes() > 0:
                found.append((i, type(units[i]).__name__, name, shape, t.untyped_storage().nbytes()))
                break
    return found


def _watch(units, layout, seen, state):
    """Hooks that record, at every forward/backward boundary of every unit, which OTHER units hold full params.

    The running unit and the next one of the pass (``state["pass"]``: forward or backward), which is being
    prefetched, may hold theirs; a recompute in backward runs the units' forward hooks in the backward pass.
    """
    def note(event, unit=None):
        allowed = () if unit is None else (unit, _next_unit(layout, unit, state["pass"]))
        for holder in _holders(units, layout, allowed):
            if len(seen) < 5:
                seen.append((event, holder, allowed))

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


def _still_held(when, before, exclude, saved=None, states=(), accept=0):
    """(when, bytes, description) of the storages alive now that were not before, less ``exclude`` and less
    copies of the generator ``states`` taken before the pass.

    Every storage in the rank counts (found through gc: attributes, closures, dicts, ...), and so does
    every storage autograd saved for backward in ``saved`` (C++ holds those, out of gc's sight).  ``accept``:
    the bytes the caller will accept, which spares the slow collections when no more are found.
    """
    held = harness.live_storages(exclude=[before, exclude], accept=accept)
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
    state = {"pass": "forward"}
    note = _watch(units, layout, out["held"], state) if watch else (lambda event, unit=None: None)
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
            state["pass"] = "forward"
            with harness.phase("forward", step=step), (harness.saved_for_backward() if measure else nullcontext()) \
                    as saved:
                prediction = fsdp(shard(x, rank, world))
            note(f"{when}: after the forward returned")
            shards = list(fsdp.parameters())
            if measure:
                out["memory"].append(_still_held(f"{when}: after the forward returned, before backward", before,
                                                 [activations, prediction, shards], saved, states))
            loss = mse(prediction, shard(y, rank, world))
            state["pass"] = "backward"
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


THREE_UNITS = dict(world_size=3, widths=[3, 4, 2, 5], local_batch=2, steps=1, seed=0, micro_batches=1)


@hs.fewer_examples(0.5)
@example(dict(THREE_UNITS, optimizer=OptimizerSpec("SGD", {"lr": 0.1})))   # a unit beyond the prefetched one
@given(fsdp_cases(widths=st.one_of(hs.mlp_widths(3, 3), mlp_widths_with_tiny())))
def test_no_unit_holds_full_parameters_outside_its_own_pass(target, case):
    values, _ = _run(target, case, watch=True, full_state=True)
    for rank, out in enumerate(values):
        for event, (unit, kind, name, shape, nbytes), allowed in out["held"][:1]:
            running = [u for u in allowed if u is not None]
            may = (f"only unit {running[0]} (running) and unit {running[1]} (the next one, prefetched) may hold "
                   f"theirs" if len(running) == 2 else f"only unit {running[0]} (running) may hold its own"
                   if running else "no unit may hold its full parameters")
            harness.check(False, f"{event}, unit {unit} ({kind}) holds its full parameter {name!r} of shape "
                                 f"{shape} ({nbytes} bytes of storage): {may}; outside its own forward and "
                                 "backward, and the compute of the unit before it in the pass (while it is "
                                 "prefetched), a unit keeps only its 1/N shard; free the full parameters right "
                                 f"after each use ({_describe(case)})",
                          rank=rank)


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
def test_two_all_gathers_and_one_reduce_scatter_per_unit(target, record_property, case):
    _, trace = _run(target, case)
    n = case["world_size"]
    layout = _layout(random_mlp(case["widths"], 0))
    e = torch.empty(0, dtype=torch.float64).element_size()
    shards = sorted(shard_size(numel, n) * e for _, _, numel in layout)
    # the cost model per rank per step, K = len(shards) units (the statement's concept section): every figure is
    # fixed, each unit's collectives carrying exactly its shard S_u (its padded gradient for the reduce_scatter)
    model = {"all-gather bytes per rank (forward)": sum(shards),
             "all-gather bytes per rank (backward)": sum(shards),
             "reduce-scatter bytes per rank": n * sum(shards), "messages per rank": 3 * len(shards)}
    measured = {}
    for rank in range(n):
        for step in range(case["steps"]):
            for phase, want, what, figures in (
                    ("forward", {"all_gather": shards}, "one all_gather of its shard",
                     "all-gather bytes per rank (forward) = Σ_u S_u · elem_size"),
                    ("backward", {"all_gather": shards, "reduce_scatter": [n * b for b in shards]},
                     "one all_gather of its shard and one reduce_scatter of its padded gradient",
                     "all-gather bytes per rank (backward) = Σ_u S_u · elem_size, reduce-scatter bytes per rank = "
                     "N · Σ_u S_u · elem_size")):
                ops = trace.ops(rank, phase=phase, step=step)
                got = {kind: sorted(op.in_bytes for op in ops if op.kind == kind) for kind in {op.kind for op in ops}}
                sizes = ", ".join(f"{kind} inputs {b} bytes" for kind, b in want.items())
                harness.check(got == want,
                              f"the {phase} pass issued {[op.describe() for op in ops]}; per unit with parameters "
                              f"it must issue {what}, and nothing else: {sizes} (the cost model: {figures}, "
                              f"messages per rank = 3K = {3 * len(shards)} in all; {_describe(case)})",
                              rank=rank, step=step)
            ops = trace.ops(rank, step=step)
            wire = sum(ring_wire_bytes(op.kind, op.in_bytes, n) for op in ops)
            padded = n * sum(shards)
            harness.check(math.isclose(wire, 3 * (n - 1) / n * padded),
                          f"on a ring this step puts {wire:g} bytes on the wire; 2 all_gathers and 1 reduce_scatter "
                          f"per unit make 3(N-1)/N x {padded} padded parameter bytes = "
                          f"{3 * (n - 1) / n * padded:g}", rank=rank, step=step)
            measured[rank, step] = ops
    # the figures of rank 0's last step, from the trace: the checks above held every rank and step to them
    ops = measured[0, case["steps"] - 1]
    yours = {"all-gather bytes per rank (forward)": sum(op.in_bytes for op in ops
                                                        if op.kind == "all_gather" and op.phase == "forward"),
             "all-gather bytes per rank (backward)": sum(op.in_bytes for op in ops
                                                         if op.kind == "all_gather" and op.phase == "backward"),
             "reduce-scatter bytes per rank": sum(op.in_bytes for op in ops if op.kind == "reduce_scatter"),
             "messages per rank": len(ops)}
    cost.record(record_property, f"{len(shards)} units of {sum(shards) // e} shard elements (float64) on {n} ranks",
                n * sum(shards), **{name: (model[name], yours[name]) for name in model})


# ---- prefetch: the next unit's all_gather travels while this unit computes ------------------------

def _mark_compute_starts(units, state, seen_grads, on_mark=None):
    """Hooks that mark, in the trace, where each unit's compute starts in each pass (``state``: pass, step).

    Forward: as the unit runs, after the hooks the code under test put on it before.  Backward: when the
    gradient of the unit's output arrives (a hook registered after the code's own, on the tensor the unit
    returned), and again if the unit runs again for a recompute (its forward hooks fire in the backward pass);
    the last of these marks is where its backward compute starts.  ``on_mark(i, args)`` runs at each mark.
    Every gradient that reaches a unit's input or output is kept in ``seen_grads``: it is no unit's memory.
    """
    def mark(i, args=None):
        with harness.phase(f"unit {i} {state['pass']}", step=state["step"]):
            pass
        if on_mark is not None:
            on_mark(i, args)

    def gradient_arrives(i, grad):
        seen_grads.append(grad)
        mark(i)

    def runs(i, args):
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                a.register_hook(seen_grads.append)
        mark(i, args)

    def returned(i, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad, i=i: gradient_arrives(i, grad))

    for i, unit in enumerate(units):
        unit.register_forward_pre_hook(lambda m, args, i=i: runs(i, args))
        unit.register_forward_hook(lambda m, args, output, i=i: returned(i, output))


def _compute_starts(trace, rank, unit, direction, step):
    """When ``unit``'s compute started in that pass: its first mark in forward, its last in backward."""
    spans = [s.start for s in trace.phases(rank, f"unit {unit} {direction}") if s.step == step]
    return (min(spans) if direction == "forward" else max(spans)) if spans else None


def _train_marked(target, widths, local_batch, steps, optimizer, seed, micro_batches=1, compute_dtype=None,
                  measure=False):
    """Runs on every rank: ``_train``'s loop with each unit's compute starts marked in the trace.

    With ``compute_dtype`` the model and data are float32 (the master dtype) and the wrapper is built with
    it; the dtypes each unit with parameters computes in are recorded as it runs.  ``measure``: at each mark
    of a unit with parameters, the storages the pass created that are still alive are measured, as
    ``test_gathered_parameters_do_not_stay_alive`` does, and so is who holds full parameters.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.float64 if compute_dtype is None else torch.float32
    model = random_mlp(widths, seed, dtype=dtype)
    units, layout = list(model), _layout(model)
    options = {} if compute_dtype is None else {"compute_dtype": compute_dtype}
    with harness.phase("construct"):
        fsdp = target.load().FullyShardedModel(model, **options)
    state = {"pass": "forward", "step": 0}
    out = {"history": [], "computes_in": [], "shard_dtypes": [], "grad_dtypes": [], "outputs": [], "memory": [],
           "held": []}
    activations, seen_grads, kept, pass_start = [], [], [], {}
    shards = list(fsdp.parameters())
    named = {i: names for i, names, _ in layout}
    full_bytes = {i: shard_size(numel, world) * world * (compute_dtype or dtype).itemsize for i, _, numel in layout}

    def on_mark(i, args):
        if i not in named:
            return
        if args is not None and state["pass"] == "forward":
            out["computes_in"].append((i, [str(a.dtype) for a in args if isinstance(a, torch.Tensor)],
                                       {name: str(getattr(units[i], name).dtype) for name, _ in named[i]}))
        if not measure:
            return
        nxt = _next_unit(layout, i, state["pass"])
        when = f"step {state['step']}, as unit {i}'s {state['pass']} compute starts"
        out["held"].extend((when, holder, (i, nxt)) for holder in _holders(units, layout, (i, nxt)))
        budget = full_bytes[i] + full_bytes.get(nxt, 0)
        states = pass_start["states"]
        out["memory"].append(_still_held(
            when, pass_start["before"], [activations, seen_grads, kept, shards, [p.grad for p in shards]],
            pass_start["saved"], states, accept=budget + len(units) * sum(t.numel() for t in states)) + (i, nxt))

    if measure:
        _record_activations(units, activations)
    _mark_compute_starts(units, state, seen_grads, on_mark)
    opt = optimizer.build(fsdp.parameters())
    batches = random_batches(steps * micro_batches, local_batch * world, widths[0], widths[-1], seed + 1, dtype=dtype)
    for step in range(steps):
        state["step"] = step
        opt.zero_grad(set_to_none=True)
        for x, y in batches[step * micro_batches:(step + 1) * micro_batches]:
            for pass_only in (activations, seen_grads, kept):
                pass_only.clear()
            if measure:
                pass_start["states"] = generator_states()
                pass_start["before"] = harness.live_storages(collect=False)
            state["pass"] = "forward"
            with harness.phase("forward", step=step), (harness.saved_for_backward() if measure else nullcontext()) \
                    as saved:
                pass_start["saved"] = saved
                prediction = fsdp(shard(x, rank, world))
            out["outputs"].append(str(prediction.dtype))
            if prediction.requires_grad:
                prediction.register_hook(seen_grads.append)
            loss = mse(prediction.to(dtype), shard(y, rank, world))
            seed_gradient = torch.ones_like(loss)   # backward's first gradient, held here, is no unit's memory
            kept.extend([prediction, loss, seed_gradient])
            state["pass"] = "backward"
            with harness.phase("backward", step=step):
                loss.backward(seed_gradient)
        out["shard_dtypes"].append([str(p.dtype) for p in fsdp.parameters()])
        out["grad_dtypes"].append([None if p.grad is None else str(p.grad.dtype) for p in fsdp.parameters()])
        opt.step()
        out["history"].append([p.detach().clone() for p in fsdp.parameters()])
    return out


def _run_marked(target, case, **extra):
    args = {k: v for k, v in case.items() if k != "world_size"}
    return harness.run(_train_marked, case["world_size"], target, **args, **extra,
                       timeout=60 if extra.get("measure") else None)


def _pass_order(layout, direction):
    units = [i for i, _, _ in layout]
    return units if direction == "forward" else units[::-1]


@hs.fewer_examples(0.2)
@example(dict(THREE_UNITS, optimizer=OptimizerSpec("SGD", {"lr": 0.1})))
@given(fsdp_cases(min_world=2, max_steps=2, widths=hs.mlp_widths(2, 3)))
def test_next_unit_all_gather_issued_before_current_unit_computes(target, case):
    _, trace = _run_marked(target, case)
    # trusted torch code: a longer limit covers the first import of torch.distributed.fsdp in each rank
    _, oracle_trace = harness.run(_fsdp2_train, case["world_size"], case["widths"], case["local_batch"],
                                  case["steps"], case["optimizer"], case["seed"], prefetch=True, timeout=60)
    n = case["world_size"]
    layout = _layout(random_mlp(case["widths"], 0))
    sizes = {i: shard_size(numel, n) * 8 for i, _, numel in layout}
    for rank in range(n):
        for step in range(case["steps"]):
            for direction in ("forward", "backward"):
                order = _pass_order(layout, direction)
                gathers = trace.ops(rank, "all_gather", direction, step)
                got, want = [op.in_bytes for op in gathers], [sizes[i] for i in order]
                harness.check(got == want,
                              f"the {direction} pass issued all_gathers of {got} bytes, in that order; it gathers "
                              f"each unit once, in the order the pass reaches them (units {order}): {want} bytes "
                              f"({_describe(case)})", rank=rank, step=step)
                for position, unit in enumerate(order):
                    start = _compute_starts(trace, rank, unit, direction, step)
                    harness.check(start is not None, f"unit {unit} never ran its {direction} (the test's hooks on "
                                                     f"it saw nothing) ({_describe(case)})", rank=rank, step=step)
                    issued = [op for op in gathers if op.issued_at < start]
                    need = min(position + 2, len(order))
                    which = f"unit {unit}'s own all_gather" + (
                        f" and unit {order[position + 1]}'s (the next one)" if position + 1 < len(order) else "")
                    harness.check(len(issued) >= need,
                                  f"as unit {unit}'s {direction} compute started, the pass had issued "
                                  f"{len(issued)} all_gather(s) ({[op.describe() for op in issued]}); {which} "
                                  f"must be issued by then, so that the next unit's parameters travel while this "
                                  f"one computes: prefetch one unit ahead ({_describe(case)})", rank=rank, step=step)
                kinds = [op.kind for op in trace.ops(rank, ("all_gather", "reduce_scatter"), direction, step)]
                fsdp2 = [op.kind for op in oracle_trace.ops(rank, ("all_gather", "reduce_scatter"), direction, step)]
                harness.check(kinds == fsdp2,
                              f"the {direction} pass issued its collectives in the order {kinds}; torch's FSDP2 "
                              f"with prefetching (each unit's forward prefetch set to the next unit, backward "
                              f"prefetch as it comes) issues {fsdp2} ({_describe(case)})", rank=rank, step=step)


@hs.fewer_examples(0.08)
@example(dict(THREE_UNITS, optimizer=OptimizerSpec("SGD", {"lr": 0.1})))
@given(fsdp_cases(min_world=2, max_steps=1, widths=hs.mlp_widths(3, 3)))
def test_at_most_two_units_gathered_at_once(target, case):
    values, _ = _run_marked(target, case, measure=True)
    n = case["world_size"]
    full = {i: shard_size(numel, n) * n * 8 for i, _, numel in _layout(random_mlp(case["widths"], 0))}
    for rank, out in enumerate(values):
        for when, (unit, kind, name, shape, nbytes), (running, nxt) in out["held"][:1]:
            others = f" and unit {nxt} (the next one)" if nxt is not None else ""
            harness.check(False, f"{when}, unit {unit} ({kind}) holds its full parameter {name!r} of shape {shape} "
                                 f"({nbytes} bytes of storage): only unit {running}{others} may hold theirs "
                                 f"({_describe(case)})", rank=rank)
        for when, nbytes, held, unit, nxt in out["memory"]:
            budget = full[unit] + (full[nxt] if nxt is not None else 0)
            two = f"unit {unit}'s and unit {nxt}'s" if nxt is not None else f"unit {unit}'s"
            harness.check(nbytes <= budget,
                          f"{when}, this rank holds {nbytes} bytes of tensor storage that the pass created: "
                          f"{held}.  Beyond the activations, the gradients flowing between units, the shards and "
                          f"their gradients, only {two} gathered full parameters may be alive ({budget} bytes: "
                          f"N*S elements each): at most two units at once, the one computing and the one "
                          f"prefetched ({_describe(case)})", rank=rank)


# ---- a second oracle: torch's FSDP2 -------------------------------------------------------------

def _fsdp2_train(widths, local_batch, steps, optimizer, seed, micro_batches=1, prefetch=False, mixed_precision=False):
    """torch.distributed.fsdp.fully_shard on every unit with parameters, then on the root.

    FSDP2 reduce-scatters after every backward and adds the result to the sharded .grad.  ``prefetch``: each
    unit's forward prefetch is set to the next unit (FSDP2 prefetches one unit ahead in backward by itself).
    ``mixed_precision``: float32 model and data, ``MixedPrecisionPolicy(param_dtype=bfloat16,
    reduce_dtype=float32)``: bf16 all_gathers and compute, float32 reduce_scatters, float32 sharded parameters.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.float32 if mixed_precision else torch.float64
    policy = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} \
        if mixed_precision else {}
    model = random_mlp(widths, seed, dtype=dtype)
    units = [child for child in model if list(child.parameters())]
    for child in units:
        fully_shard(child, **policy)
    fully_shard(model, **policy)
    if prefetch:
        for unit, after in zip(units, units[1:]):
            unit.set_modules_to_forward_prefetch([after])
    opt = optimizer.build(model.parameters())
    history, outputs = [], []
    batches = random_batches(steps * micro_batches, local_batch * world, widths[0], widths[-1], seed + 1, dtype=dtype)
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        for x, y in batches[step * micro_batches:(step + 1) * micro_batches]:
            with harness.phase("forward", step=step):
                prediction = model(shard(x, rank, world))
            outputs.append(str(prediction.dtype))
            loss = mse(prediction.to(dtype), shard(y, rank, world))
            with harness.phase("backward", step=step):
                loss.backward()
        opt.step()
        # this rank's dim-0 chunk of each parameter (full_tensor() would use untraced functional collectives)
        history.append([p.to_local().detach().clone() for p in model.parameters()])
    return {"history": history, "outputs": outputs}


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


# ---- compute_dtype: bf16 compute on float32 master shards, as FSDP2's MixedPrecisionPolicy -------------

BF16_TOLERANCE = dict(atol=1e-2, rtol=1e-2)   # a few bf16 ulps (2^-8 relative) after 1-2 steps


@hs.fewer_examples(0.2)
@given(fsdp_cases(min_world=2, max_steps=2, micro_batches=st.integers(1, 2)))
def test_compute_dtype_matches_fsdp2_mixed_precision(target, case):
    values, trace = _run_marked(target, case, compute_dtype=torch.bfloat16)
    oracle, oracle_trace = harness.run(_fsdp2_train, case["world_size"], case["widths"], case["local_batch"],
                                       case["steps"], case["optimizer"], case["seed"], case["micro_batches"],
                                       mixed_precision=True, timeout=60)
    model = random_mlp(case["widths"], 0)
    layout, names = _layout(model), [n for n, _ in model.named_parameters()]
    what = f"compute_dtype=torch.bfloat16 on a float32 model ({_describe(case)})"
    for rank, out in enumerate(values):
        for step, (shards, grads) in enumerate(zip(out["shard_dtypes"], out["grad_dtypes"])):
            harness.check(all(d == "torch.float32" for d in shards + grads),
                          f"the shards are {shards} and their gradients {grads}; they stay float32, the master "
                          f"copy the optimizer steps, whatever the units compute in ({what})", rank=rank, step=step)
        for unit, inputs, attributes in out["computes_in"]:
            harness.check(all(d == "torch.bfloat16" for d in inputs + list(attributes.values())),
                          f"unit {unit} computed with inputs {inputs} and parameters {attributes}; with "
                          f"compute_dtype it computes in bfloat16, inputs and gathered parameters alike ({what})",
                          rank=rank)
        harness.check(out["outputs"] == oracle[rank]["outputs"],
                      f"fsdp(x) returned {out['outputs']}; FSDP2 returns {oracle[rank]['outputs']} ({what})",
                      rank=rank)
    for direction in ("forward", "backward"):
        for kind in ("all_gather", "reduce_scatter"):
            got = sorted({d for op in trace.ops(0, kind, direction) for d in op.dtypes})
            want = sorted({d for op in oracle_trace.ops(0, kind, direction) for d in op.dtypes})
            harness.check(got == want, f"the {direction} pass's {kind}s carried {got}; FSDP2's carry {want} ({what})")
    for step in range(case["steps"]):
        got_params = _assemble(values, layout, case["world_size"], step)
        fsdp2 = [torch.cat(chunks) for chunks in zip(*(out["history"][step] for out in oracle))]
        for name, got, want in zip(names, got_params, fsdp2):
            harness.assert_close(got, want, f"parameter {name} against torch's FSDP2 fully_shard with "
                                 f"MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32), {what}",
                                 step=step, **BF16_TOLERANCE)


@hs.fewer_examples(0.3)
@given(fsdp_cases(min_world=2, max_steps=2))
def test_compute_dtype_all_gathers_carry_bf16(target, case):
    _, trace = _run_marked(target, case, compute_dtype=torch.bfloat16)
    n = case["world_size"]
    layout = _layout(random_mlp(case["widths"], 0))
    shards = sorted(shard_size(numel, n) for _, _, numel in layout)
    gathers = [("torch.bfloat16", 2 * s) for s in shards]
    reduces = [("torch.float32", 4 * n * s) for s in shards]
    for rank in range(n):
        for step in range(case["steps"]):
            for phase, want, what in (
                    ("forward", {"all_gather": gathers}, "one all_gather of its shard cast to bfloat16"),
                    ("backward", {"all_gather": gathers, "reduce_scatter": reduces},
                     "one all_gather of its shard cast to bfloat16 and one reduce_scatter of its padded gradient "
                     "in float32")):
                ops = trace.ops(rank, phase=phase, step=step)
                got = {kind: sorted((",".join(op.dtypes), op.in_bytes) for op in ops if op.kind == kind)
                       for kind in {op.kind for op in ops}}
                harness.check(got == want,
                              f"with compute_dtype=torch.bfloat16 the {phase} pass issued "
                              f"{[f'{op.describe()} {op.dtypes}' for op in ops]}; per unit with parameters it must "
                              f"issue {what}, and nothing else: {want} (dtype, input bytes) ({_describe(case)})",
                              rank=rank, step=step)
            wire = sum(ring_wire_bytes(op.kind, op.in_bytes, n) for op in trace.ops(rank, step=step))
            want = (n - 1) / n * n * sum(shards) * (2 * 2 + 4)
            harness.check(math.isclose(wire, want),
                          f"on a ring this step puts {wire:g} bytes on the wire; 2 bf16 all_gathers and 1 float32 "
                          f"reduce_scatter per unit make (N-1)/N x {n * sum(shards)} padded elements x (2 + 2 + 4) "
                          f"bytes = {want:g}", rank=rank, step=step)
