"""Problem 129 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); the expected values come from one unsharded matmul
``X @ W`` and its backward, computed here in the test process in float64, and what was sent, to whom, while
what compute ran, comes from the harness's trace (every call of this problem counts compute: problems.yaml's
``probes``).  Each rank receives only its own shards of x, w and of the output gradient (``harness.per_rank``).
"""
import torch
from hypothesis import example, given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.groups import member_group
from testkit.overlap import check_receives_overlap_compute
from testkit.overlap_cost import hidden_fraction, ring_figures

TOLERANCE = {torch.float64: dict(atol=1e-10, rtol=1e-8), torch.float32: dict(atol=2e-5, rtol=2e-5)}
AG, RS = "all_gather_matmul", "matmul_reduce_scatter"
CALL = ("forward", "backward")     # the phases the learner's code runs in


# ---- cases, inputs and the truth -----------------------------------------------------------------------

@st.composite
def cases(draw, dtypes=(torch.float64,), members=False):
    """N ranks (a group of some of them with ``members``), chunks of 1-3 rows, an optional batch dim,
    1-4 input features and 1-4 output features on each rank."""
    world = draw(hs.world_sizes(2 if members else 1))
    group = sorted(draw(st.sets(st.integers(0, world - 1), min_size=1))) if members else None
    return dict(world_size=world, members=group, chunk=draw(st.integers(1, 3)),
                batch=draw(st.sampled_from([None, 1, 2])), k=draw(st.integers(1, 4)), n=draw(st.integers(1, 4)),
                dtype=draw(st.sampled_from(dtypes)), seed=draw(hs.seeds()))


def an_example(**changes):
    """3 ranks, chunks of 2 rows, a batch dim of 2: ring order, direction and layout bugs all show here."""
    return example(dict(dict(world_size=3, members=None, chunk=2, batch=2, k=3, n=2, dtype=torch.float64,
                             seed=0), **changes))


def holders(case):
    """The global ranks that hold a shard, in ring (group rank) order."""
    return case["members"] or list(range(case["world_size"]))


def shard_slices(name, case, i):
    """Ring rank i's slice of X, of W and of Y = X @ W (so of dY too).

    all_gather_matmul: rows i of X (the sequence), columns i of W and of Y (a column-parallel weight).
    matmul_reduce_scatter: columns i of X (its input features), rows i of W, rows i of Y (the sequence).
    """
    c, k, n = case["chunk"], case["k"], case["n"]
    seq = (slice(i * c, (i + 1) * c),)
    if name == AG:
        cols = (..., slice(i * n, (i + 1) * n))
        return seq, cols, cols
    return (..., slice(i * k, (i + 1) * k)), (slice(i * k, (i + 1) * k),), seq


def full_problem(name, case):
    """The unsharded X, W and dY, float64 values of the case's dtype, from the seed."""
    ring, c, k, n, dtype = len(holders(case)), case["chunk"], case["k"], case["n"], case["dtype"]
    gen = torch.Generator().manual_seed(case["seed"])
    batch = () if case["batch"] is None else (case["batch"],)
    k_all, n_all = (k, ring * n) if name == AG else (ring * k, n)
    shapes = [(ring * c, *batch, k_all), (k_all, n_all), (ring * c, *batch, n_all)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype).double() for s in shapes]


def piece(t, where, dtype):
    """A copy, never a view: a pickled view carries its whole storage, which would hand a rank the whole X."""
    return t[where].to(dtype).clone(memory_format=torch.contiguous_format)


def rank_inputs(name, case, backward):
    x, w, dy = full_problem(name, case)
    inputs = [None] * case["world_size"]
    for i, rank in enumerate(holders(case)):
        xs, ws, ys = shard_slices(name, case, i)
        inputs[rank] = {"x": piece(x, xs, case["dtype"]), "w": piece(w, ws, case["dtype"]),
                        "dy": piece(dy, ys, case["dtype"]) if backward else None}
    return harness.per_rank(inputs)


def truth(name, case):
    """Per ring rank: the expected output, x.grad and w.grad, from one float64 matmul over the whole problem."""
    x, w, dy = (t.requires_grad_() for t in full_problem(name, case))
    y = x @ w
    y.backward(dy)
    expected = []
    for i in range(len(holders(case))):
        xs, ws, ys = shard_slices(name, case, i)
        expected.append({"out": y.detach()[ys], "grads": [x.grad[xs], w.grad[ws]]})
    return expected


def _call(target, name, mine, members):
    """Runs on every rank: the learner's function on this rank's shards, then, given its ``dy``, backward."""
    with member_group(members) as (group, _, index):
        if index is None:
            return None
        backward = mine["dy"] is not None
        x, w = (t.requires_grad_(backward) for t in (mine["x"], mine["w"]))
        with harness.phase("forward"):
            out = getattr(target.load(), name)(x, w, group=group)
        result = {"out": out.detach() if isinstance(out, torch.Tensor) else out}
        if backward:
            with harness.phase("backward"):
                out.backward(mine["dy"])
            result["grads"] = [x.grad, w.grad]
        return result


def run(target, name, case, backward=False):
    """One call per drawn case, function and pass, shared by the properties that check it (reuse)."""
    return harness.run(_call, case["world_size"], target, name, rank_inputs(name, case, backward), case["members"],
                       reuse=True)


def shapes(name, case):
    c, k, n, b = case["chunk"], case["k"], case["n"], case["batch"]
    ring = len(holders(case))
    mid = [] if b is None else [b]
    if name == AG:
        return [c, *mid, k], [k, n]
    return [ring * c, *mid, k], [k, n]


def describe(name, case):
    x, w = shapes(name, case)
    where = (f"the group {case['members']} of {case['world_size']} ranks" if case["members"]
             else f"{case['world_size']} rank{'s' * (case['world_size'] > 1)}")
    return f"{name}(x {x}, w {w}) on {where}, {str(case['dtype']).replace('torch.', '')}"


def seq_rows(case, i):
    c = case["chunk"]
    return f"rows {i * c}..{(i + 1) * c - 1}"


def check_outputs(values, name, case):
    for i, (rank, want) in enumerate(zip(holders(case), truth(name, case))):
        out = values[rank]["out"]
        harness.check(isinstance(out, torch.Tensor), f"{describe(name, case)} returned {type(out).__name__}, not a "
                      "tensor", rank=rank)
        what = ("X @ w: the whole gathered sequence X times this rank's w" if name == AG else
                f"{seq_rows(case, i)} of the sum over the ranks of x @ w (this rank's chunk of the sequence)")
        harness.assert_close(out, want["out"].to(case["dtype"]), f"{describe(name, case)}: the output, {what}",
                             rank=rank, **TOLERANCE[case["dtype"]])


def check_gradients(values, name, case):
    for i, (rank, want) in enumerate(zip(holders(case), truth(name, case))):
        for label, got, expected in zip(("x", "w"), values[rank]["grads"], want["grads"]):
            harness.check(got is not None, f"{describe(name, case)}: after backward, {label}.grad is None: the "
                          "output must be differentiable for x and w (Part 3)", rank=rank)
            harness.assert_close(got, expected.to(case["dtype"]),
                                 f"{describe(name, case)}: {label}.grad (the unsharded matmul's gradient of this "
                                 f"rank's shard of {label.upper()})", rank=rank, **TOLERANCE[case["dtype"]])


def message_bytes(name, case):
    """One chunk of what travels: c x batch x (k for the x chunks of all_gather_matmul, n for the partial sums
    of matmul_reduce_scatter) x element size."""
    features = case["k"] if name == AG else case["n"]
    return case["chunk"] * (case["batch"] or 1) * features * case["dtype"].itemsize


def check_only_p2p_with_neighbours(trace, name, case, phase):
    """Every op ``phase`` issued is a send or recv to or from a ring neighbour (ring order: group rank order)."""
    members = holders(case)
    for i, rank in enumerate(members):
        neighbours = sorted({members[(i + 1) % len(members)], members[(i - 1) % len(members)]} - {rank})
        for op in trace.ops(rank, phase=phase):
            what = f"{describe(name, case)}: {phase} issued {op.describe()}"
            harness.check(op.is_p2p, f"{what}; only point-to-point isend/irecv (or batch_isend_irecv) may run: "
                          "the ring is yours to build, no collective", rank=rank)
            harness.check(op.peer in neighbours, f"{what}; in the ring {members}, rank {rank} may only talk to its "
                          f"neighbours {neighbours}", rank=rank)


def check_forward_ring(trace, name, case):
    """N - 1 sends and N - 1 receives per rank, each one chunk (bytes from the model), one way round the ring."""
    check_only_p2p_with_neighbours(trace, name, case, "forward")
    members, size = holders(case), message_bytes(name, case)
    travelling = "x chunk" if name == AG else "partial sum of one output chunk"
    shape = ([case["chunk"], *([case["batch"]] if case["batch"] else []),
              case["k"] if name == AG else case["n"]])
    direction = None     # (+1: data flows towards the next rank, -1: towards the previous one; the op that set it)
    for i, rank in enumerate(members):
        nxt, prev = members[(i + 1) % len(members)], members[(i - 1) % len(members)]
        for kind in ("send", "recv"):
            ops = trace.ops(rank, kind, phase="forward")
            harness.check(len(ops) == len(members) - 1,
                          f"{describe(name, case)}: forward issued {len(ops)} {kind}s; a ring of N = {len(members)} "
                          f"ranks takes N - 1 = {len(members) - 1} hops, one {travelling} each", rank=rank)
            for op in ops:
                what = f"{describe(name, case)}: forward issued {op.describe()}"
                carried = op.in_bytes if kind == "send" else op.out_bytes
                harness.check(carried == size and op.dtypes == [str(case["dtype"])],
                              f"{what}, {carried} bytes; every message is ONE {travelling}, {shape} "
                              f"{str(case['dtype']).replace('torch.', '')} = {size} bytes", rank=rank)
                flow = +1 if op.peer == (nxt if kind == "send" else prev) else -1
                if direction is None:
                    direction = (flow, what)
                harness.check(flow == direction[0],
                              f"{what}, so its data flows towards the {'next' if flow > 0 else 'previous'} rank; but "
                              f"{direction[1]}, whose data flows towards the {'next' if direction[0] > 0 else 'previous'}"
                              f" rank. Messages go one way round the ring {members}, the same way on every rank",
                              rank=rank)


def record_ring_cost(record_property, trace, name, case):
    """The cost model's figures, once check_forward_ring has passed: it fixes N - 1 messages of M bytes
    (M = one x chunk, or one output chunk's partial sum), all to the same neighbour, so every figure is exact."""
    hops, m = len(holders(case)) - 1, message_bytes(name, case)
    measured = ring_figures(trace, holders(case), "forward")
    cost.record(record_property, describe(name, case), hops * m, bytes_per_rank=(hops * m, measured["bytes_per_rank"]),
                busiest_link=(hops * m, measured["busiest_link"]), messages_per_rank=(hops, measured["messages_per_rank"]))


def check_matmul_overlaps(record_property, trace, name, case, travelling):
    """Between posting each forward receive and waiting on it, the rank ran a matmul that its output needed:
    the cost model's hidden fraction is 1."""
    check_receives_overlap_compute(trace, holders(case), "forward", describe(name, case), travelling, work="matmul",
                                   advice=f"post the isend/irecv of the {travelling}, run the matmul whose result "
                                          "the output uses while it travels, and only then wait")
    cost.record(record_property, describe(name, case), len(holders(case)) * message_bytes(name, case),
                hidden_fraction=(1.0, hidden_fraction(trace, holders(case), "forward")))


# ---- Part 1: all-gather + GEMM ---------------------------------------------------------------------------

@given(cases(dtypes=(torch.float64, torch.float32)))
@an_example()
def test_all_gather_matmul_matches_the_unsharded_matmul(target, case):
    values, _ = run(target, AG, case)
    check_outputs(values, AG, case)


@given(cases(dtypes=(torch.float64, torch.float32)))
@an_example()
def test_all_gather_matmul_passes_x_chunks_round_the_ring(target, record_property, case):
    _, trace = run(target, AG, case)
    check_forward_ring(trace, AG, case)
    record_ring_cost(record_property, trace, AG, case)


@given(cases(dtypes=(torch.float64, torch.float32)))
@an_example()
def test_all_gather_matmul_computes_while_the_next_chunk_travels(target, record_property, case):
    _, trace = run(target, AG, case)
    check_matmul_overlaps(record_property, trace, AG, case, "next x chunk")


# ---- Part 2: GEMM + reduce-scatter -----------------------------------------------------------------------

@given(cases(dtypes=(torch.float64, torch.float32)))
@an_example()
def test_matmul_reduce_scatter_matches_the_unsharded_matmul(target, case):
    values, _ = run(target, RS, case)
    check_outputs(values, RS, case)


@given(cases(dtypes=(torch.float64, torch.float32)))
@an_example()
def test_matmul_reduce_scatter_passes_partial_sums_round_the_ring(target, record_property, case):
    _, trace = run(target, RS, case)
    check_forward_ring(trace, RS, case)
    record_ring_cost(record_property, trace, RS, case)


@given(cases(dtypes=(torch.float64, torch.float32)))
@an_example()
def test_matmul_reduce_scatter_computes_while_the_partial_sum_travels(target, record_property, case):
    _, trace = run(target, RS, case)
    check_matmul_overlaps(record_property, trace, RS, case, "partial sum")


def _raises(target, mine):
    try:
        target.load().matmul_reduce_scatter(mine["x"], mine["w"])
    except ValueError as e:
        return str(e)
    return None


@hs.fewer_examples(0.3)
@given(hs.world_sizes(2).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, 3 * n).filter(lambda s: s % n))))
@example((4, 6))
def test_indivisible_sequence_raises_value_error(target, case):
    n, s = case
    x, w = torch.ones(s, 2, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64)
    values, trace = harness.run(_raises, n, target, harness.per_rank([{"x": x, "w": w}] * n))
    call = f"matmul_reduce_scatter(x [{s}, 2], w [2, 3]) on {n} ranks"
    for rank, message in enumerate(values):
        harness.check(message is not None, f"{call}: {s} rows cannot be split in {n} equal chunks, but no "
                      "ValueError was raised", rank=rank)
        harness.check(str(s) in message and str(n) in message, f"{call} raised ValueError({message!r}); the "
                      f"message must name the sequence length {s} and N = {n}", rank=rank)
        ops = trace.ops(rank)
        harness.check(not ops, f"{call} raised, but only after it communicated ({ops[0].describe() if ops else ''})"
                      ": check the length before any message", rank=rank)


# ---- Part 3: backward ------------------------------------------------------------------------------------

@hs.fewer_examples(0.6)
@given(cases(dtypes=(torch.float64, torch.float32)))
@an_example()
def test_all_gather_matmul_gradients(target, case):
    values, _ = run(target, AG, case, backward=True)
    check_gradients(values, AG, case)


@hs.fewer_examples(0.6)
@given(cases(dtypes=(torch.float64, torch.float32)))
@an_example()
def test_matmul_reduce_scatter_gradients(target, case):
    values, _ = run(target, RS, case, backward=True)
    check_gradients(values, RS, case)


@hs.fewer_examples(0.6)
@given(cases(dtypes=(torch.float64, torch.float32)))
@an_example()
def test_backward_stays_on_the_ring(target, case):
    for name in (AG, RS):
        _, trace = run(target, name, case, backward=True)   # the gradients' runs, again (reuse)
        check_only_p2p_with_neighbours(trace, name, case, "backward")


@hs.fewer_examples(0.4)
@given(cases(members=True), st.sampled_from([AG, RS]))
@example(dict(world_size=4, members=[1, 2, 3], chunk=2, batch=2, k=3, n=2, dtype=torch.float64, seed=0), RS)
def test_runs_on_a_process_group(target, case, name):
    values, trace = run(target, name, case, backward=True)
    check_outputs(values, name, case)
    check_gradients(values, name, case)
    for rank in range(case["world_size"]):
        harness.check(rank in case["members"] or not trace.ops(rank),
                      f"{describe(name, case)}: rank {rank} is outside the group but communicated", rank=rank)
    check_forward_ring(trace, name, case)
    check_only_p2p_with_neighbours(trace, name, case, "backward")
