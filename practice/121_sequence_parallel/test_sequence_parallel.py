"""Problem 121 properties.  Each test is one line of the statement's list ("What the tests check").

Learner code runs only on the ranks (``harness.run``); the single-device block's output and
gradients are computed here, in the test process, with plain PyTorch.  Each rank receives the
full layers (the constructor's contract) and only its own rows of x and of the upstream gradient
(``harness.per_rank``); the seed stays here.  Which entries of the full layers a rank's parameters
hold is found by value (every entry of the full layers is distinct), never by attribute names.
What was communicated comes from the harness's trace; the rows the LayerNorm saw from a dispatch
mode around the rank's forward and backward.
"""
import math

import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import harness
from testkit import cost, strategies as hs
from testkit.flat_shards import ring_wire_bytes
from testkit.groups import contiguous_groups, group_layout, positions

# The expected values are tiny tensors: one thread computes them far faster than a pool
# competing with the ranks for the cores.
torch.set_num_threads(1)
TOLERANCE = {torch.float64: dict(atol=1e-10, rtol=1e-8), torch.float32: dict(atol=2e-5, rtol=1e-4)}
REPLICATED = ("ln.weight", "ln.bias", "fc2.bias")
SHARDED = ("fc1.weight", "fc1.bias", "fc2.weight")
PASSES = ("forward", "backward")


def _bytes(case, *shape) -> int:
    return math.prod(shape) * torch.finfo(case["dtype"]).bits // 8


def _rank_and_pass(t):
    """(rank, "forward"), (rank, "backward") for every rank."""
    return [(r, phase) for r in range(t) for phase in PASSES]


def _ops_in(trace, rank, phase, t, expected, what):
    """The op kinds ``phase`` issued on ``rank`` are ``expected``, in order (t = 1: no-op collectives may be
    skipped); returns those ops."""
    ops = trace.ops(rank, phase=phase)
    got = [op.kind for op in ops]
    allowed = [k for k in expected if k in got] if t == 1 else list(expected)
    listed = " then ".join(f"one {k}" for k in expected) or "no communication"
    harness.check(got == allowed, f"{what}: {phase} must issue {listed}; it issued "
                                  f"{'; '.join(op.describe() for op in ops) or 'nothing'}", rank=rank)
    return ops


# ---- the two communication functions -------------------------------------------------------------

@st.composite
def sequence_cases(draw):
    """t ranks, k rows each (s = t*k), and 0-2 trailing dims."""
    return dict(t=draw(hs.world_sizes()), k=draw(st.integers(1, 3)),
                rest=tuple(draw(st.lists(st.integers(1, 3), max_size=2))), dtype=draw(hs.dtypes()),
                seed=draw(hs.seeds()))


def _rows(case, rank, rows, salt):
    gen = torch.Generator().manual_seed(case["seed"] * 5 + 7919 * rank + salt)
    return torch.randn((rows,) + case["rest"], generator=gen, dtype=torch.float64).to(case["dtype"])


def _through(target, name, mine):
    """Runs on every rank: its own x through one function forward, then its own upstream gradient back."""
    x = mine["x"].clone().requires_grad_()
    with harness.phase("forward"):
        y = getattr(target.load(), name)(x)
    x_grad = None
    if tuple(y.shape) == tuple(mine["grad"].shape):
        with harness.phase("backward"):
            (x_grad,) = torch.autograd.grad(y, x, mine["grad"])
    return {"y": y.detach(), "x_grad": x_grad, "x_after": x.detach()}


def _check_sequence_function(target, name, case, kinds, sizes, expect_y, expect_grad):
    """``sizes`` = (rows of x, rows of y); ``kinds`` = (forward op, backward op)."""
    t, k = case["t"], case["k"]
    xs = [_rows(case, r, sizes[0], 1) for r in range(t)]
    gs = [_rows(case, r, sizes[1], 2) for r in range(t)]
    values, trace = harness.run(_through, t, target, name, harness.per_rank({"x": x, "grad": g}
                                                                            for x, g in zip(xs, gs)))
    call, tol = f"{name}(x) on {t} ranks, x of shape {[sizes[0], *case['rest']]}", TOLERANCE[case["dtype"]]
    for r, out in enumerate(values):
        for phase, kind in zip(PASSES, kinds):
            for op in _ops_in(trace, r, phase, t, [kind], call):
                in_rows = k if kind == "all_gather" else t * k      # its own shard; its whole input
                harness.check(op.in_bytes == _bytes(case, in_rows, *case["rest"]) and op.group == tuple(range(t)),
                              f"{call}: the {phase} {kind} should carry this rank's {in_rows} rows "
                              f"({_bytes(case, in_rows, *case['rest'])} bytes) on ranks {list(range(t))}; "
                              f"it carried {op.in_bytes} bytes on ranks {list(op.group)} ({op.site})", rank=r)
        harness.assert_close(out["x_after"], xs[r], f"{call}: x after the call (it must not be modified in place)",
                             rank=r, exact=True)
        harness.assert_close(out["y"], expect_y(xs, r), f"{call}: forward output", rank=r, **tol)
        harness.assert_close(out["x_grad"], expect_grad(gs, r), f"{call}: gradient reaching x", rank=r, **tol)


@hs.fewer_examples(0.6)
@given(sequence_cases())
def test_all_gather_sequence(target, case):
    """all_gather_sequence: rank order along dim 0; backward = reduce-scatter of every rank's gradient."""
    t, k = case["t"], case["k"]
    _check_sequence_function(target, "all_gather_sequence", case, ("all_gather", "reduce_scatter"), (k, t * k),
                             expect_y=lambda xs, r: torch.cat(xs),
                             expect_grad=lambda gs, r: sum(gs[1:], gs[0])[r * k:(r + 1) * k])


@hs.fewer_examples(0.6)
@given(sequence_cases())
def test_reduce_scatter_sequence(target, case):
    """reduce_scatter_sequence: this rank's rows of the sum; backward = all-gather; x not modified in place."""
    t, k = case["t"], case["k"]
    _check_sequence_function(target, "reduce_scatter_sequence", case, ("reduce_scatter", "all_gather"), (t * k, k),
                             expect_y=lambda xs, r: sum(xs[1:], xs[0])[r * k:(r + 1) * k],
                             expect_grad=lambda gs, r: torch.cat(gs))


# ---- the block: cases, the single-device block, what each rank ran -------------------------------

@st.composite
def block_cases(draw, t=None):
    """t ranks (3 and 4 half the time), s = t*k rows, batch b, hidden h, ffn f = t*j; fc biases mostly on."""
    t = t or draw(hs.world_sizes())
    return dict(t=t, s=t * draw(st.integers(1, 3)), b=draw(st.integers(1, 2)), h=draw(st.integers(3, 5)),
                f=t * draw(st.integers(1, 2)), bias=draw(st.sampled_from([True, True, False])),
                dtype=draw(hs.dtypes()), seed=draw(hs.seeds()))


def describe(case) -> str:
    t, s, b, h, f = (case[k] for k in "tsbhf")
    return (f"SequenceParallelMLP(LayerNorm({h}), Linear({h}, {f}), Linear({f}, {h}), bias={case['bias']}) on "
            f"t={t} ranks, x [{s}, {b}, {h}] ({_rows_each(s // t)} each)")


def _rows_each(k: int) -> str:
    return f"{k} row" if k == 1 else f"{k} rows"


def full_block(case, index=0):
    """The full single-device layers (ln, fc1, fc2); every entry of all of them distinct, in (-1, 1)."""
    h, f, dtype, bias = case["h"], case["f"], case["dtype"], case["bias"]
    layers = (nn.LayerNorm(h, dtype=dtype), nn.Linear(h, f, bias=bias, dtype=dtype),
              nn.Linear(f, h, bias=bias, dtype=dtype))
    params = [p for layer in layers for p in layer.parameters()]
    gen = torch.Generator().manual_seed(case["seed"] + 31 * index)
    total = sum(p.numel() for p in params)
    values = (torch.randperm(total, generator=gen) + 1).double() / (total + 1)
    values = torch.where(torch.rand(total, generator=gen, dtype=torch.float64) < 0.3, -values, values)
    with torch.no_grad():
        for p, v in zip(params, values.split([p.numel() for p in params])):
            p.copy_(v.view_as(p))
    return layers


def block_data(case, index=0):
    """The full input x [s, b, h] and the upstream gradient of the full output."""
    gen = torch.Generator().manual_seed(case["seed"] + 104729 * (index + 1))
    shape = (case["s"], case["b"], case["h"])
    return tuple(torch.randn(shape, generator=gen, dtype=torch.float64).to(case["dtype"]) for _ in range(2))


def expected_block(case, index=0):
    """The single-device block x + fc2(gelu(fc1(ln(x)))), forward and backward."""
    ln, fc1, fc2 = full_block(case, index)
    x, grad = block_data(case, index)
    x.requires_grad_()
    y = x + fc2(F.gelu(fc1(ln(x))))
    y.backward(grad)
    named = {f"{n}.{p}": t for n, layer in zip(("ln", "fc1", "fc2"), (ln, fc1, fc2))
             for p, t in layer.named_parameters()}
    return dict(y=y.detach(), x_grad=x.grad, tensors={n: t.detach() for n, t in named.items()},
                grads={n: t.grad for n, t in named.items()})


class _LayerNormRows(TorchDispatchMode):
    """Below autograd: the input shape and normalized shape of every layer-norm kernel call (forward and
    backward), whichever way it was reached (the module, a copy of it, F.layer_norm, torch.layer_norm)."""

    KERNELS = {"native_layer_norm": 0, "native_layer_norm_backward": 1}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else ""
        if name in self.KERNELS:
            x, normalized = args[self.KERNELS[name]], args[self.KERNELS[name] + 1]
            self.calls.append((name, tuple(x.shape), tuple(normalized)))
        return func(*args, **(kwargs or {}))


def _sp_block(target, mine, tp_size=None):
    """Runs on every rank: build from the full layers, forward its rows, backward, finish_grad_sync."""
    m = target.load()
    if tp_size is None:
        return _block_step(m, mine, None)
    with contiguous_groups(tp_size) as (group, _, _):
        return _block_step(m, mine, group)


def _block_step(m, mine, group):
    with harness.phase("construct"):
        block = m.SequenceParallelMLP(*mine["layers"], group=group)
    x = mine["x"].requires_grad_()
    out, layer_norm = {"x_grad": None}, _LayerNormRows()
    with layer_norm:
        with harness.phase("forward"):
            y = block(x)
        if tuple(y.shape) == tuple(mine["grad"].shape):
            with harness.phase("backward"):
                y.backward(mine["grad"])
            out["x_grad"] = x.grad
    if out["x_grad"] is not None:
        with harness.phase("grad_sync"):
            block.finish_grad_sync()
    out.update(y=y.detach(), layer_norm=layer_norm.calls,
               params=[{"name": n, "value": p.detach(), "grad": None if p.grad is None else p.grad.detach()}
                       for n, p in block.named_parameters()])
    return out


def block_inputs(case, where):
    """per_rank, placed by ``where[rank] = (group index, rank in the group)``: the full layers and that rank's
    rows of x and of the upstream gradient (copies, not views of the full tensors)."""
    t, inputs = case["t"], []
    for rank in range(len(where)):
        index, r = where[rank]
        rows = slice(r * case["s"] // t, (r + 1) * case["s"] // t)
        x, grad = block_data(case, index)
        inputs.append({"layers": full_block(case, index), "x": x[rows].clone(), "grad": grad[rows].clone()})
    return harness.per_rank(inputs)


def run_block(target, case, world=None):
    """One run per drawn case, shared by the properties below (reuse); on ``world`` ranks as groups of t."""
    if world is None:
        return harness.run(_sp_block, case["t"], target, block_inputs(case, {r: (0, r) for r in range(case["t"])}),
                           reuse=True)
    return harness.run(_sp_block, world, target, block_inputs(case, positions(world, case["t"])), case["t"])


def _own_rows(case, r):
    k = case["s"] // case["t"]
    return slice(r * k, (r + 1) * k)


def check_block_values(case, values, where):
    """Every rank's output rows and input-gradient rows equal the single-device block's."""
    tol, want = TOLERANCE[case["dtype"]], {}
    for rank, out in enumerate(values):
        index, r = where[rank]
        full = want.setdefault(index, expected_block(case, index))
        rows = _own_rows(case, r)
        harness.assert_close(out["y"], full["y"][rows], f"{describe(case)}: output rows {rows.start}-{rows.stop - 1}",
                             rank=rank, **tol)
        harness.assert_close(out["x_grad"], full["x_grad"][rows],
                             f"{describe(case)}: gradient of input rows {rows.start}-{rows.stop - 1}", rank=rank, **tol)


def _must_hold(case, r) -> dict:
    """Full tensor name -> (the flat indices rank r's parameters must hold, in words)."""
    h, f, t = case["h"], case["f"], case["t"]
    k = f // t
    cols = range(r * k, (r + 1) * k)
    out = {"ln.weight": (set(range(h)), "all of it"), "ln.bias": (set(range(h)), "all of it"),
           "fc1.weight": ({i * h + j for i in cols for j in range(h)}, f"rows {cols.start}-{cols.stop - 1}"),
           "fc2.weight": ({i * f + j for i in range(h) for j in cols}, f"columns {cols.start}-{cols.stop - 1}")}
    if case["bias"]:
        out.update({"fc1.bias": (set(cols), f"entries {cols.start}-{cols.stop - 1}"),
                    "fc2.bias": (set(range(h)), "all of it")})
    return out


def check_param_grads(case, out, want, names, rank, r):
    """For the full tensors in ``names``: every parameter entry from them has the full block's gradient, and
    each entry this rank must hold (``_must_hold``) is in some parameter."""
    where = {v: (n, i) for n, t in want["tensors"].items() for i, v in enumerate(t.flatten().tolist())}
    covered = {n: set() for n in names}
    for p in out["params"]:
        spots = [where.get(v) for v in p["value"].flatten().tolist()]
        harness.check(None not in spots, f"{describe(case)}: parameter '{p['name']}' holds values that are in none "
                                         "of the full layers: keep copies of their entries", rank=rank)
        mine = [(j, spot) for j, spot in enumerate(spots) if spot[0] in names]
        if not mine:
            continue
        held = sorted({spot[0] for _, spot in mine})
        harness.check(p["grad"] is not None, f"{describe(case)}: parameter '{p['name']}' (entries of "
                                             f"{', '.join(held)}) has no .grad after backward", rank=rank)
        got = p["grad"].flatten()[[j for j, _ in mine]]
        expected = torch.stack([want["grads"][n].flatten()[i] for _, (n, i) in mine])
        harness.assert_close(got, expected, f"{describe(case)}: gradient of parameter '{p['name']}' (entries of "
                                            f"{', '.join(held)}) after backward and finish_grad_sync",
                             rank=rank, **TOLERANCE[case["dtype"]])
        for _, (n, i) in mine:
            covered[n].add(i)
    for n, (indices, what) in _must_hold(case, r).items():
        missing = len(indices - covered[n]) if n in names else 0
        harness.check(not missing, f"{describe(case)}: {missing} entries of {n} that this rank must hold ({what}) "
                                   "are in none of its parameters", rank=rank)


def _check_grads_on_every_rank(target, case, names):
    want = expected_block(case)
    for r, out in enumerate(run_block(target, case).values):
        check_param_grads(case, out, want, names, r, r)


# ---- the properties of the block -----------------------------------------------------------------

@hs.fewer_examples(0.5)
@given(block_cases())
def test_block_matches_single_device(target, case):
    """Output rows and input-gradient rows equal the single-device block's, on every rank."""
    check_block_values(case, run_block(target, case).values, {r: (0, r) for r in range(case["t"])})


@hs.fewer_examples(0.5)
@given(block_cases())
def test_shard_gradients_match_the_full_block(target, case):
    """The gradients of the fc1 and fc2 weight shards (and fc1's bias) equal the full layers' entries."""
    _check_grads_on_every_rank(target, case, SHARDED)


@hs.fewer_examples(0.5)
@given(block_cases())
def test_replicated_gradients_match_the_full_block(target, case):
    """After finish_grad_sync, ln's weight and bias and fc2's bias have the full gradients on every rank."""
    _check_grads_on_every_rank(target, case, REPLICATED)


@hs.fewer_examples(0.5)
@given(block_cases())
def test_layer_norm_sees_only_its_own_rows(target, case):
    """Every layer-norm kernel call, forward and backward, normalises this rank's s/t*b rows of h, no more."""
    rows, h = case["s"] // case["t"] * case["b"], case["h"]
    for r, out in enumerate(run_block(target, case).values):
        calls = out["layer_norm"]
        harness.check(any(name == "native_layer_norm" for name, _, _ in calls),
                      f"{describe(case)}: no layer norm ran in forward; apply the LayerNorm (the module, a copy of "
                      "it, or F.layer_norm with its weight, bias and eps)", rank=r)
        for name, shape, normalized in calls:
            seen = math.prod(shape) // max(1, math.prod(normalized))
            harness.check(seen == rows and normalized == (h,),
                          f"{describe(case)}: a layer norm ({name}) ran on an input of shape {list(shape)}: "
                          f"{_rows_each(seen)} of {list(normalized)}; with sequence parallelism each rank normalises "
                          f"only its own {_rows_each(rows)} (s/t*b) of [{h}]", rank=r)


@hs.fewer_examples(0.5)
@given(block_cases())
def test_one_all_gather_and_one_reduce_scatter_each_way(target, record_property, case):
    """Forward and backward each issue one all_gather (of this rank's rows) then one reduce_scatter (of the full
    sequence), on the tensor-parallel group, with the bytes of the formula."""
    t, s, b, h = (case[k] for k in "tsbh")
    shard, full, group = _bytes(case, s // t, b, h), _bytes(case, s, b, h), tuple(range(t))
    trace = run_block(target, case).trace
    for r, phase in _rank_and_pass(t):
        for op in _ops_in(trace, r, phase, t, ["all_gather", "reduce_scatter"], describe(case)):
            want = shard if op.kind == "all_gather" else full
            harness.check(op.in_bytes == want and op.group == group,
                          f"{describe(case)}: the {phase} {op.kind} carried {op.in_bytes} bytes on ranks "
                          f"{list(op.group)}; the cost model's bytes per rank, 2(A/t + A) over both passes, has it "
                          f"carry {want} bytes ({'A/t: s/t' if want == shard else 'A: s'}*b*h elements) on ranks "
                          f"{list(group)} ({op.site})", rank=r)
    # the kinds and each op's bytes are the model's (checked above): the figures, for the cost table
    by_rank = [[op for phase in PASSES for op in trace.ops(r, phase=phase)] for r in range(t)]
    cost.record(record_property, describe(case), full if t > 1 else -1,
                bytes_per_rank=(2 * (shard + full), max(sum(op.in_bytes for op in mine) for mine in by_rank)),
                messages_per_rank=(4, max(map(len, by_rank))))


@hs.fewer_examples(0.5)
@given(block_cases())
def test_no_all_reduce_of_activations(target, case):
    """Forward and backward issue no all_reduce; finish_grad_sync issues only all_reduces, of the replicated
    gradients (2h + h with fc2's bias elements in all), on the group."""
    t, h = case["t"], case["h"]
    replicated = _bytes(case, 3 * h if case["bias"] else 2 * h)
    trace = run_block(target, case).trace
    for r in range(t):
        for op in trace.ops(r, "all_reduce"):
            harness.check(op.phase not in PASSES,
                          f"{describe(case)}: the {op.phase} pass issued an all_reduce of {op.in_bytes} bytes "
                          f"({op.site}); sequence parallelism replaces the all_reduce of activations with a "
                          "reduce_scatter and an all_gather", rank=r)
        ops = trace.ops(r, phase="grad_sync")
        sent = sum(op.in_bytes for op in ops)
        harness.check(all(op.kind == "all_reduce" and op.group == tuple(range(t)) for op in ops)
                      and sent in ((0, replicated) if t == 1 else (replicated,)),
                      f"{describe(case)}: finish_grad_sync should all_reduce the replicated gradients (ln.weight, "
                      f"ln.bias, fc2.bias: {replicated} bytes in all) on ranks {list(range(t))}; it issued "
                      f"{'; '.join(op.describe() for op in ops) or 'nothing'}", rank=r)


@hs.fewer_examples(0.5)
@given(block_cases())
def test_same_volume_as_tensor_parallel(target, record_property, case):
    """Per rank and per pass, the ring bytes of SP's ops equal those of 117's one all_reduce of the activation."""
    t, s, b, h = (case[k] for k in "tsbh")
    activation = _bytes(case, s, b, h)
    tensor_parallel = ring_wire_bytes("all_reduce", activation, t)      # 2(t-1)/t * s*b*h*e
    trace = run_block(target, case).trace
    most = 0.0
    for r, phase in _rank_and_pass(t):
        ops = trace.ops(r, phase=phase)
        wire = sum(ring_wire_bytes(op.kind, op.in_bytes, t) for op in ops)
        most = max(most, wire)
        harness.check(math.isclose(wire, tensor_parallel, abs_tol=1e-6),
                      f"{describe(case)}: ring bytes per pass: the {phase} pass puts {wire:g} bytes on the wire in "
                      f"a ring (from in_bytes: {', '.join(f'{op.kind} {op.in_bytes}' for op in ops) or 'nothing'}); "
                      f"the cost model's 2·(t−1)/t · A, 117's one all_reduce of the {activation}-byte activation, "
                      f"is {tensor_parallel:g}", rank=r)
    cost.record(record_property, describe(case), activation if t > 1 else -1,
                ring_bytes_per_pass=(tensor_parallel, most))


# ---- errors and process groups -------------------------------------------------------------------

@st.composite
def indivisible_cases(draw):
    """On t >= 2 ranks, a block whose f, or a reduce_scatter_sequence input whose s, t does not divide."""
    t = draw(hs.world_sizes(min_size=2))
    bad = draw(st.integers(1, 3 * t).filter(lambda size: size % t))
    return draw(st.sampled_from(["block", "reduce_scatter_sequence"])), bad, draw(block_cases(t=t))


def _raises(target, what, bad, layers, h):
    """Runs on every rank: the constructor, or reduce_scatter_sequence, with an indivisible size."""
    m = target.load()
    try:
        if what == "block":
            m.SequenceParallelMLP(*layers)
        else:
            m.reduce_scatter_sequence(layers[0].weight.new_zeros(bad, 1, h))
    except ValueError as e:
        return str(e)
    return None


@hs.fewer_examples(0.4)
@given(indivisible_cases())
def test_indivisible_sizes_raise_value_error(target, drawn):
    """f (fc1.out_features) or s not divisible by t: ValueError naming the size and t."""
    what, bad, case = drawn
    t = case["t"]
    layers = full_block(dict(case, f=bad) if what == "block" else case)
    call = (f"SequenceParallelMLP(LayerNorm({case['h']}), Linear({case['h']}, {bad}), ...)" if what == "block"
            else f"reduce_scatter_sequence(x of {bad} rows)") + f" on t={t} ranks"
    for r, message in enumerate(harness.run(_raises, t, target, what, bad, layers, case["h"]).values):
        harness.check(message is not None, f"{call} did not raise ValueError", rank=r)
        harness.check(str(bad) in message and str(t) in message,
                      f"{call} raised ValueError({message!r}); the message must name {bad} and {t}", rank=r)


@st.composite
def subgroup_cases(draw):
    """(world, t): groups of t consecutive ranks, each a block of its own."""
    world, t = draw(st.sampled_from([(2, 1), (3, 1), (4, 2), (3, 3)]))
    return world, draw(block_cases(t=t))


@hs.fewer_examples(0.4)
@given(subgroup_cases())
def test_runs_on_a_sub_group(target, drawn):
    """Inside groups of t ranks: every op on the group passed in, and each group's block right, replicated
    gradients included."""
    world, case = drawn
    values, trace = run_block(target, case, world)
    layout, where = group_layout(world, case["t"]), positions(world, case["t"])
    for rank in range(world):
        mine = tuple(layout[where[rank][0]])
        for op in trace.ops(rank):
            harness.check(op.group == mine, f"{describe(case)} with group={list(mine)} (world of {world}): "
                                            f"{op.describe()} ran on ranks {list(op.group)}; every op must run on "
                                            "the group passed in", rank=rank)
    check_block_values(case, values, where)
    for rank, out in enumerate(values):
        check_param_grads(case, out, expected_block(case, where[rank][0]), REPLICATED, rank, where[rank][1])
