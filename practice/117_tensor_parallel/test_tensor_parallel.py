"""Problem 117 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); the full layers' outputs and
gradients are computed here, in the test process, with plain single-process PyTorch.
Which slice of the weights a rank holds is found by value (``shard_match.py``, beside this file),
never by reading attribute names.  Each rank receives the full layers (the contract) and
only its own input and upstream gradient (``harness.per_rank``); the seed stays here.
"""
import math

import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st
from torch import nn

import harness
from testkit import cost, strategies as hs
from testkit.groups import contiguous_groups, group_layout, positions

# this folder's own helper, shard_match.py (conftest.py makes it importable by name)
from shard_match import (check_holds_exactly, check_nothing_else_kept, check_own_storage, check_shard_grads, columns,
                         distinct_values_, held_tensors, kept_storages, rows, storages_before)

# The expected values are tiny tensors: one thread computes them ~100x faster than a pool
# competing with the ranks for the cores.
torch.set_num_threads(1)
TOLERANCE = {torch.float64: dict(atol=1e-10, rtol=1e-8), torch.float32: dict(atol=2e-5, rtol=1e-4)}
KINDS = ("column", "row", "mlp", "attention")


# ---- the three communication functions ----------------------------------------------------------

@st.composite
def comm_cases(draw):
    n = draw(hs.world_sizes())
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    return dict(n=n, shape=tuple(lead) + (draw(st.integers(1, 4)),), dtype=draw(hs.dtypes()), seed=draw(hs.seeds()))


def _rank_tensor(case, rank, salt, last=None):
    shape = case["shape"] if last is None else case["shape"][:-1] + (last,)
    gen = torch.Generator().manual_seed(case["seed"] + 7919 * rank + salt)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(case["dtype"])


def _comm_function(target, name, mine):
    """Runs on every rank: this rank's own x and upstream grad through one function, forward and backward."""
    fn = getattr(target.load(), name)
    x = mine["x"].requires_grad_()
    with harness.phase("forward"):
        y = fn(x)
    out = {"y": y.detach().clone(), "x_grad": None, "x_after": x.detach().clone()}
    if tuple(y.shape) == tuple(mine["grad"].shape):
        with harness.phase("backward"):
            y.backward(mine["grad"])
        out["x_grad"] = x.grad
    return out


def _check_ops(trace, rank, phase, expected, n, what):
    """The op kinds issued in ``phase`` are ``expected``; with one rank, skipping a no-op collective is fine."""
    got = [op.kind for op in trace.ops(rank, phase=phase)]
    if n == 1 and all(k in expected for k in got) and len(got) <= len(expected):
        return
    sites = "; ".join(op.describe() for op in trace.ops(rank, phase=phase)) or "nothing"
    harness.check(got == expected, f"{what}: the {phase} pass must issue {_op_list(expected)}, it issued "
                                   f"{_op_list(got)} ({sites})", rank=rank)


def _op_list(kinds):
    return "no communication" if not kinds else " then ".join(f"one {k}" for k in kinds)


def _check_comm_function(target, name, case, forward_ops, backward_ops, expect_y, expect_grad):
    n = case["n"]
    xs = [_rank_tensor(case, r, 1) for r in range(n)]
    out_last = case["shape"][-1] * (n if name == "gather_from_tp" else 1)
    gs = [_rank_tensor(case, r, 2, last=out_last) for r in range(n)]
    own = harness.per_rank({"x": x, "grad": g} for x, g in zip(xs, gs))   # no rank sees the others' x or grad
    values, trace = harness.run(_comm_function, n, target, name, own)
    tol = TOLERANCE[case["dtype"]]
    for r, out in enumerate(values):
        _check_ops(trace, r, "forward", forward_ops, n, name)
        _check_ops(trace, r, "backward", backward_ops, n, name)
        harness.assert_close(out["x_after"], xs[r], f"{name}(x): x after the call (it must not be modified in "
                                                    "place)", rank=r, exact=True)
        harness.assert_close(out["y"], expect_y(xs, r), f"{name}(x) forward output", rank=r, **tol)
        harness.assert_close(out["x_grad"], expect_grad(gs, r), f"{name}(x): gradient reaching x", rank=r, **tol)


@hs.fewer_examples(0.6)
@given(comm_cases())
def test_copy_to_tp(target, case):
    _check_comm_function(target, "copy_to_tp", case, [], ["all_reduce"],
                         expect_y=lambda xs, r: xs[r], expect_grad=lambda gs, r: sum(gs[1:], gs[0]))


@hs.fewer_examples(0.6)
@given(comm_cases())
def test_reduce_from_tp(target, case):
    _check_comm_function(target, "reduce_from_tp", case, ["all_reduce"], [],
                         expect_y=lambda xs, r: sum(xs[1:], xs[0]), expect_grad=lambda gs, r: gs[r])


@hs.fewer_examples(0.6)
@given(comm_cases())
def test_gather_from_tp(target, case):
    k = case["shape"][-1]
    _check_comm_function(target, "gather_from_tp", case, ["all_gather"], [],
                         expect_y=lambda xs, r: torch.cat(xs, dim=-1),
                         expect_grad=lambda gs, r: gs[r][..., r * k:(r + 1) * k])


# ---- the layers: cases, the full single-process layers, each rank's shard ------------------------

@st.composite
def tp_cases(draw, kinds=KINDS, n=None):
    n = n or draw(hs.world_sizes())
    kind = draw(st.sampled_from(kinds))
    case = dict(kind=kind, n=n, dtype=draw(hs.dtypes()), bias=draw(st.sampled_from([True, False])),
                seed=draw(hs.seeds()), lead=tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))))
    width, per_rank = st.integers(1, 5), st.integers(1, 3)
    if kind == "column":
        case.update(d_in=draw(width), d_out=n * draw(per_rank), gather_output=draw(st.booleans()))
    elif kind == "row":
        case.update(d_in=n * draw(per_rank), d_out=draw(width), input_is_parallel=draw(st.booleans()))
    elif kind == "mlp":
        case.update(d_in=draw(width), hidden=n * draw(per_rank), d_out=draw(width))
    else:
        case.update(embed=draw(width), heads=n * draw(st.integers(1, 2)), head_dim=draw(st.integers(1, 3)),
                    seq=draw(st.integers(1, 4)))
    return case


def full_layers(case, index=0) -> dict:
    """The full (unsharded) nn.Linear layers, every entry distinct; same on every rank and in the test."""
    dtype, bias = case["dtype"], case["bias"]
    kind = case["kind"]
    if kind in ("column", "row"):
        layers = {"fc": nn.Linear(case["d_in"], case["d_out"], bias=bias, dtype=dtype)}
    elif kind == "mlp":
        layers = {"fc1": nn.Linear(case["d_in"], case["hidden"], bias=bias, dtype=dtype),
                  "fc2": nn.Linear(case["hidden"], case["d_out"], bias=bias, dtype=dtype)}
    else:
        hd = case["heads"] * case["head_dim"]
        layers = {"qkv": nn.Linear(case["embed"], 3 * hd, bias=bias, dtype=dtype),
                  "proj": nn.Linear(hd, case["embed"], bias=bias, dtype=dtype)}
    distinct_values_([p for layer in layers.values() for p in layer.parameters()], case["seed"] + index)
    return layers


def full_tensors(layers) -> dict:
    return {f"{name}.{p}": t for name, layer in layers.items() for p, t in layer.named_parameters()}


def _input_shape(case):
    last = case["embed"] if case["kind"] == "attention" else case["d_in"]
    return case["lead"] + ((case["seq"],) if case["kind"] == "attention" else ()) + (last,)


def _output_shape(case):
    return _input_shape(case)[:-1] + (case["embed"] if case["kind"] == "attention" else case["d_out"],)


def layer_inputs(case, index=0):
    """The full input x and the full upstream gradient of the full output."""
    gen = torch.Generator().manual_seed(case["seed"] + 104729 * (index + 1))
    x = torch.randn(_input_shape(case), generator=gen, dtype=torch.float64).to(case["dtype"])
    grad = torch.randn(_output_shape(case), generator=gen, dtype=torch.float64).to(case["dtype"])
    return x, grad


def _sharded_input(case):
    return case["kind"] == "row" and case["input_is_parallel"]


def _sharded_output(case):
    return case["kind"] == "column" and not case["gather_output"]


def _own(size, r, n):
    k = size // n
    return slice(r * k, (r + 1) * k)


def full_forward(case, layers, x):
    """Single-process reference: the unsharded layers, written out plainly."""
    kind = case["kind"]
    if kind in ("column", "row"):
        return layers["fc"](x)
    if kind == "mlp":
        return layers["fc2"](F.gelu(layers["fc1"](x)))
    h, d = case["heads"], case["head_dim"]
    qkv = layers["qkv"](x)
    heads = []
    for i in range(h):  # [q; k; v], each head-major: head i is rows i*d:(i+1)*d of each part
        q, k, v = (qkv[..., part * h * d + i * d: part * h * d + (i + 1) * d] for part in range(3))
        heads.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1) @ v)
    return layers["proj"](torch.cat(heads, dim=-1))


def expected_layer(case, index=0):
    layers = full_layers(case, index)
    x, grad = layer_inputs(case, index)
    x.requires_grad_()
    y = full_forward(case, layers, x)
    y.backward(grad)
    return dict(y=y.detach(), x=x.detach(), x_grad=x.grad, tensors=full_tensors(layers),
                grads={name: t.grad for name, t in full_tensors(layers).items()})


def _span(s: slice, of: int) -> str:
    return f"[{s.start}, {s.stop}) of {of}"


def shards(case, r, n) -> dict:
    """full tensor name -> (flat indices this rank must hold, shaped like its shard; description)."""
    tensors = full_tensors(full_layers(case))
    out = {}

    def add(name, index, what):
        if name in tensors:
            out[name] = (index(tuple(tensors[name].shape)), what)

    def column_part(name, size):
        own = _own(size, r, n)
        add(f"{name}.weight", lambda s: rows(s, range(own.start, own.stop)), f"rows {_span(own, size)}")
        add(f"{name}.bias", lambda s: rows(s, range(own.start, own.stop)), f"entries {_span(own, size)}")

    def row_part(name, size):
        own = _own(size, r, n)
        add(f"{name}.weight", lambda s: columns(s, range(own.start, own.stop)), f"columns {_span(own, size)}")
        add(f"{name}.bias", lambda s: rows(s, range(s[0])), "all of it, the same on every rank")

    kind = case["kind"]
    if kind == "column":
        column_part("fc", case["d_out"])
    elif kind == "row":
        row_part("fc", case["d_in"])
    elif kind == "mlp":
        column_part("fc1", case["hidden"])
        row_part("fc2", case["hidden"])
    else:
        h, d = case["heads"], case["head_dim"]
        mine = _own(h, r, n)
        picked = [part * h * d + i * d + j for part in range(3) for i in range(mine.start, mine.stop) for j in range(d)]
        what = f"the rows of heads {_span(mine, h)} in each of q, k and v"
        add("qkv.weight", lambda s: rows(s, picked), what)
        add("qkv.bias", lambda s: rows(s, picked), what.replace("rows", "entries"))
        row_part("proj", h * d)
    return out


def _construct(m, spec, layers, group):
    """Build the parallel layer that ``spec`` (a case without its seed) names, from the full layers."""
    kind = spec["kind"]
    if kind == "column":
        return m.ColumnParallelLinear(layers["fc"], gather_output=spec["gather_output"], group=group)
    if kind == "row":
        return m.RowParallelLinear(layers["fc"], input_is_parallel=spec["input_is_parallel"], group=group)
    if kind == "mlp":
        return m.ParallelMLP(layers["fc1"], layers["fc2"], group=group)
    return m.ParallelSelfAttention(layers["qkv"], layers["proj"], spec["heads"], group=group)


def layer_inputs_by_rank(case, where):
    """per_rank, placed by ``where[rank] = (group index, rank in the group, group size)``: the full layers
    (the constructors' contract), and the input and upstream gradient as that rank sees them: full, or only
    its own slice where the layer's input or output is sharded (a copy, not a view of the full tensor)."""
    inputs = []
    for rank in range(len(where)):
        index, r, n = where[rank]
        x, grad = layer_inputs(case, index)
        x = x[..., _own(x.shape[-1], r, n)].clone() if _sharded_input(case) else x
        grad = grad[..., _own(grad.shape[-1], r, n)].clone() if _sharded_output(case) else grad
        inputs.append({"layers": full_layers(case, index), "x": x, "grad": grad})
    return harness.per_rank(inputs)


def layer_spec(case) -> dict:
    """What a rank needs to build the layer: its kind and options (the seed stays in the test process)."""
    return {k: v for k, v in case.items() if k != "seed"}


def _tp_layer(target, spec, mine, tp_size=None, scan=False):
    """Runs on every rank: build the parallel layer from the full one, forward, backward, report."""
    m = target.load()
    if tp_size is None:
        return _layer_step(m, spec, mine, None, scan)
    with contiguous_groups(tp_size) as (group, _, _):
        return _layer_step(m, spec, mine, group, scan)


def _layer_step(m, spec, mine, group, scan):
    """With ``scan``, also every storage still alive once this function has let go of the full layers."""
    layers = mine.pop("layers")   # the argument's only reference to them: after construction they may die
    before = storages_before(layers) if scan else None
    with harness.phase("construct"):
        layer = _construct(m, spec, layers, group)
    del layers
    x = mine["x"].requires_grad_()
    with harness.phase("forward"):
        y = layer(x)
    out = {"y": y.detach().clone(), "x_grad": None}
    if tuple(y.shape) == tuple(mine["grad"].shape):
        with harness.phase("backward"):
            y.backward(mine["grad"])
        out["x_grad"] = x.grad
    out["held"] = held_tensors(layer)
    if scan:
        out["kept"] = kept_storages(layer, before, [out, mine, x, y], spec["dtype"])
    return out


def run_layers(target, case, world=None, tp_size=None, scan=False):
    """The layer on case["n"] ranks; or, with ``tp_size``, on ``world`` ranks as groups of tp_size."""
    if tp_size is None:
        world, where = case["n"], {rank: (0, rank, case["n"]) for rank in range(case["n"])}
    else:
        where = {rank: (i, r, tp_size) for rank, (i, r) in positions(world, tp_size).items()}
    # a scan walks every object in the rank (0.1 s or more a rank)
    return harness.run(_tp_layer, world, target, layer_spec(case), layer_inputs_by_rank(case, where), tp_size, scan,
                       timeout=30 if scan else None)


def _describe(case) -> str:
    kind = case["kind"]
    if kind == "column":
        return f"ColumnParallelLinear(Linear({case['d_in']}, {case['d_out']}), gather_output={case['gather_output']})"
    if kind == "row":
        return (f"RowParallelLinear(Linear({case['d_in']}, {case['d_out']}), "
                f"input_is_parallel={case['input_is_parallel']})")
    if kind == "mlp":
        return f"ParallelMLP(Linear({case['d_in']}, {case['hidden']}), Linear({case['hidden']}, {case['d_out']}))"
    return (f"ParallelSelfAttention(qkv=Linear({case['embed']}, {3 * case['heads'] * case['head_dim']}), "
            f"proj=..., num_heads={case['heads']})")


def check_outputs_and_input_grads(case, values, index_of=lambda r: (0, r, None)):
    """Every rank's output and input gradient equal the full layers' (or this rank's slice of them)."""
    tol = TOLERANCE[case["dtype"]]
    expected = {}
    for rank, out in enumerate(values):
        index, r, n = index_of(rank)
        n = n or case["n"]
        want = expected.setdefault(index, expected_layer(case, index))
        y, x_grad = want["y"], want["x_grad"]
        if _sharded_output(case):
            y = y[..., _own(y.shape[-1], r, n)]
        if _sharded_input(case):
            x_grad = x_grad[..., _own(x_grad.shape[-1], r, n)]
        layer = _describe(case)
        harness.assert_close(out["y"], y, f"{layer}: output", rank=rank, **tol)
        harness.assert_close(out["x_grad"], x_grad, f"{layer}: gradient of its input", rank=rank, **tol)


@hs.fewer_examples(0.5)
@given(tp_cases(("column",)))
def test_column_parallel_linear(target, case):
    check_outputs_and_input_grads(case, run_layers(target, case).values)


@hs.fewer_examples(0.5)
@given(tp_cases(("row",)))
def test_row_parallel_linear(target, case):
    check_outputs_and_input_grads(case, run_layers(target, case).values)


@hs.fewer_examples(0.5)
@given(tp_cases(("mlp",)))
def test_parallel_mlp(target, case):
    check_outputs_and_input_grads(case, run_layers(target, case).values)


@hs.fewer_examples(0.5)
@given(tp_cases(("attention",)))
def test_parallel_self_attention(target, case):
    check_outputs_and_input_grads(case, run_layers(target, case).values)


@hs.fewer_examples(0.5)
@given(tp_cases())
def test_weight_grads_are_slices_of_full_grads(target, case):
    values = run_layers(target, case).values
    want = expected_layer(case)
    for r, out in enumerate(values):
        check_shard_grads(want["tensors"], out["held"], want["grads"], shards(case, r, case["n"]), rank=r,
                          **TOLERANCE[case["dtype"]])


@hs.fewer_examples(0.5)
@given(tp_cases())
def test_parameters_are_shards(target, case):
    values = run_layers(target, case, scan=True).values
    tensors = full_tensors(full_layers(case))
    for r, out in enumerate(values):
        mine = shards(case, r, case["n"])
        check_holds_exactly(tensors, out["held"], mine, rank=r)
        check_own_storage(out["held"], rank=r)
        check_nothing_else_kept(tensors, out["kept"], mine, rank=r)


def _elements(shape) -> int:
    return math.prod(shape)


def layer_cost(case, size):
    """The cost model of one forward and backward of the layer (the statement's concept section): each op's kind and
    bytes, per pass.  An all_reduce carries the whole tensor it sums; an all_gather this rank's 1/N of what it
    gathers: the output's forward (ColumnParallelLinear's gather_output), the input gradient's backward
    (RowParallelLinear with input_is_parallel=False)."""
    n, kind = case["n"], case["kind"]
    y, x = _elements(_output_shape(case)) * size, _elements(_input_shape(case)) * size
    forward, backward = [("all_reduce", y)], [("all_reduce", x)]   # ParallelMLP, ParallelSelfAttention: g, then f
    if kind == "column":
        forward = [("all_gather", y // n)] if case["gather_output"] else []
    elif kind == "row":
        backward = [] if case["input_is_parallel"] else [("all_gather", x // n)]
    return {"forward": forward, "backward": backward}


@hs.fewer_examples(0.5)
@given(tp_cases())
def test_communication_per_layer(target, record_property, case):
    _, trace = run_layers(target, case)
    n, size = case["n"], torch.finfo(case["dtype"]).bits // 8
    model = layer_cost(case, size)
    what = _describe(case)
    for r in range(n):
        for phase, ops in model.items():
            _check_ops(trace, r, phase, [kind for kind, _ in ops], n, what)
            bytes_of, tensor = dict(ops), "output" if phase == "forward" else "input gradient"
            # the kinds match the model here, so checking each op's bytes checks their sum, the bytes per rank
            for op in trace.ops(r, phase=phase):
                share = f"the full {tensor}" if op.kind == "all_reduce" else f"this rank's 1/{n} of the {tensor}"
                harness.check(op.in_bytes == bytes_of[op.kind],
                              f"{what}: the {phase} {op.kind} carried {op.in_bytes} bytes; the cost model's is "
                              f"{bytes_of[op.kind]} bytes, {share} ({op.site})", rank=r)
    # the figures, for the cost table, from the trace.  The catalogue's closed forms are a block's, so a block's
    # case is shown before any single layer's; a single rank's last (it may skip its no-op collectives)
    ops = [op for phase in model for op in trace.ops(phase=phase)]
    model_bytes = sum(b for ops_of_pass in model.values() for _, b in ops_of_pass)
    shown_first = model_bytes + (1 << 40 if case["kind"] in ("mlp", "attention") else 0) if n > 1 else -1
    cost.record(record_property, f"{what} on {n} ranks, {case['dtype']}", shown_first,
                bytes_per_rank=(model_bytes, max(sum(op.in_bytes for op in ops if op.rank == r) for r in range(n))),
                messages_per_rank=(sum(map(len, model.values())),
                                   max(sum(op.rank == r for op in ops) for r in range(n))))


# ---- errors and process groups -------------------------------------------------------------------

@st.composite
def indivisible_cases(draw):
    n = draw(hs.world_sizes(min_size=2))
    bad = n * draw(st.integers(0, 2)) + draw(st.integers(1, n - 1))
    case = draw(tp_cases(n=n))
    key = {"column": "d_out", "row": "d_in", "mlp": "hidden", "attention": "heads"}[case["kind"]]
    case[key] = bad
    return case, bad


def _construct_only(target, spec, layers):
    """Runs on every rank: only the constructor, from the full layers; reports what it raised, as plain data."""
    try:
        _construct(target.load(), spec, layers, None)
    except ValueError as e:
        return "ValueError", str(e)
    return None, None


@hs.fewer_examples(0.4)
@given(indivisible_cases())
def test_indivisible_sizes_raise_value_error(target, drawn):
    case, bad = drawn
    n = case["n"]
    values = harness.run(_construct_only, n, target, layer_spec(case), full_layers(case)).values
    name = {"column": "out_features", "row": "in_features", "mlp": "fc1.out_features",
            "attention": "num_heads"}[case["kind"]]
    for r, (kind, message) in enumerate(values):
        call = f"{_describe(case)} on {n} ranks ({name}={bad} is not divisible by {n})"
        harness.check(kind is not None, f"{call} did not raise ValueError", rank=r)
        harness.check(str(bad) in message and str(n) in message,
                      f"{call} raised ValueError({message!r}); the message must name the size {bad} and the "
                      f"tensor-parallel size {n}", rank=r)


@st.composite
def subgroup_cases(draw):
    world, tp = draw(st.sampled_from([(2, 1), (3, 1), (4, 1), (4, 2)]))
    return world, tp, draw(tp_cases(n=tp))


@hs.fewer_examples(0.4)
@given(subgroup_cases())
def test_layers_respect_the_group_argument(target, drawn):
    world, tp, case = drawn
    values, trace = run_layers(target, case, world, tp)
    layout, where = group_layout(world, tp), positions(world, tp)
    for rank in range(world):
        mine = tuple(layout[where[rank][0]])
        for op in trace.ops(rank):
            harness.check(op.group == mine,
                          f"{_describe(case)} with group={list(mine)} (world of {world}): {op.describe()} ran on "
                          f"ranks {list(op.group)}; every op must run on the group passed in", rank=rank)
    check_outputs_and_input_grads(case, values, index_of=lambda rank: where[rank] + (tp,))
