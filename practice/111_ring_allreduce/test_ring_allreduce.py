"""Problem 111 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); expected values and every
assertion live here, in the test process.  What was sent, and to whom, comes from
the harness's trace.  Each rank receives only its own tensor (``harness.per_rank``).
"""
import math

import torch
from hypothesis import example, given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.groups import member_group

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64)
NAMES = ("ring_all_reduce", "ring_reduce_scatter", "ring_all_gather")


def rank_input(shape, dtype, seed, rank):
    """Rank ``rank``'s tensor, rebuilt from the seed in the test process as well as on the rank."""
    gen = torch.Generator().manual_seed(seed * 8 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    return torch.randint(-10**6, 10**6, shape, generator=gen, dtype=dtype)


def expected_sum(shape, dtype, seed, ranks):
    """The single-process SUM of the given ranks' inputs, and the tolerance a ring may need."""
    inputs = [rank_input(shape, dtype, seed, r) for r in ranks]
    if not dtype.is_floating_point:
        return torch.stack(inputs).sum(0), {"exact": True}
    wide = torch.stack([x.double() for x in inputs])
    # each of the N-1 additions rounds by at most eps times the magnitude of the partial sum
    worst = float(wide.abs().sum(0).max()) if wide[0].numel() else 0.0
    return wide.sum(0).to(dtype), {"atol": len(ranks) * torch.finfo(dtype).eps * worst, "rtol": 0.0}


def _describe(case, what="tensor"):
    shape = tuple(case["shape"])
    return f"a {what} of shape {shape} ({math.prod(shape)} elements, {case['dtype']}) on {case['world_size']} ranks"


@st.composite
def cases(draw, dtypes=DTYPES, min_world=1):
    world = draw(hs.world_sizes(min_world))
    numel = draw(hs.numels(world))
    return dict(world_size=world, shape=draw(hs.shapes(numel)), dtype=draw(st.sampled_from(dtypes)),
                seed=draw(hs.seeds()))


@st.composite
def gather_cases(draw):
    """All-gather chunks: the same shape on every rank, with at least one dimension."""
    case = draw(cases())
    case["shape"] = draw(hs.shapes(draw(st.integers(0, 24))).filter(len))
    return case


def _invoke(target, name, x, group=None):
    """Runs on every rank: one of the learner's functions on this rank's own input, inside a phase named after it."""
    kept = x.clone()
    with harness.phase(name):
        out = getattr(target.load(), name)(x, group)
    return {"input": kept, "after": x, "out": out, "same_object": out is x}


def own_inputs(case, shape, ranks=None):
    """per_rank: each rank's own tensor, and nothing of the others' (None outside ``ranks``)."""
    ranks = range(case["world_size"]) if ranks is None else ranks
    return harness.per_rank([rank_input(shape, case["dtype"], case["seed"], r) if r in ranks else None
                             for r in range(case["world_size"])])


def _run(target, name, case):
    return harness.run(_invoke, case["world_size"], target, name, own_inputs(case, case["shape"]))


def _call_all(target, mine, group_ranks=None):
    """Runs on every rank: all three functions on this rank's own inputs, each in its own phase; with
    ``group_ranks``, on that sub-group."""
    with member_group(group_ranks) as (group, _, index):
        if index is None:
            return None
        return [_invoke(target, name, x, group) for name, x in zip(NAMES, mine)]


def _run_all(target, case, chunk_shape, members=None):
    """All three functions on every rank (or on the group of ``members``), each on its own fresh input."""
    inputs = [own_inputs(case, shape, members).values
              for shape in (case["shape"], case["shape"], chunk_shape)]   # one tensor per call: each is changed
    return harness.run(_call_all, case["world_size"], target, harness.per_rank(zip(*inputs)), group_ranks=members)


# ---- values ------------------------------------------------------------------------------------

@given(cases())
@example(dict(world_size=3, shape=(2, 4), dtype=torch.int64, seed=0))    # numel % N != 0
@example(dict(world_size=4, shape=(), dtype=torch.float32, seed=0))      # numel < N, 0-d
def test_all_reduce_sums(target, case):
    values, _ = _run(target, "ring_all_reduce", case)
    expected, tolerance = expected_sum(case["shape"], case["dtype"], case["seed"], range(case["world_size"]))
    for rank, out in enumerate(values):
        harness.assert_close(out["out"], expected, f"ring_all_reduce of {_describe(case)}: the returned tensor",
                             rank=rank, **tolerance)
        harness.check(out["same_object"], "ring_all_reduce returned a new tensor: it must SUM in place and "
                      "return the tensor it was given", rank=rank)
        harness.assert_close(out["after"], expected, f"ring_all_reduce of {_describe(case)}: the input tensor "
                             "afterwards (the SUM happens in place)", rank=rank, **tolerance)


@given(cases(dtypes=(torch.float32, torch.bfloat16, torch.float64)))
@example(dict(world_size=3, shape=(4, 4), dtype=torch.float32, seed=0))
def test_all_reduce_identical_on_every_rank(target, case):
    values, _ = _run(target, "ring_all_reduce", case)
    first = values[0]["out"]
    for rank in range(1, case["world_size"]):
        out = values[rank]["out"]
        what = f"ring_all_reduce of {_describe(case)}: the result compared bit for bit with rank 0's"
        harness.assert_close(out, first, what, rank=rank, atol=float("inf"))  # same shape and dtype
        differ = (out != first).flatten().nonzero().flatten().tolist()
        if differ:
            i = differ[0]
            harness.check(False, f"{what}: {len(differ)} of {out.numel()} values differ in their bits; first at "
                          f"flat index {i}: {out.flatten()[i].item()!r} here, {first.flatten()[i].item()!r} on rank 0. "
                          "Each chunk must be summed once, in one order, by the ranks along its path, then only "
                          "copied", rank=rank)


@given(cases())
def test_reduce_scatter_returns_own_chunk(target, case):
    values, _ = _run(target, "ring_reduce_scatter", case)
    total, tolerance = expected_sum(case["shape"], case["dtype"], case["seed"], range(case["world_size"]))
    chunks = total.flatten().tensor_split(case["world_size"])
    for rank, out in enumerate(values):
        harness.assert_close(out["out"], chunks[rank],
                             f"ring_reduce_scatter of {_describe(case)}: the result should be chunk {rank} of "
                             "tensor.flatten().tensor_split(N) of the SUM", rank=rank, **tolerance)
        harness.assert_close(out["after"], out["input"], f"ring_reduce_scatter of {_describe(case)}: the input "
                             "tensor afterwards (it must be left unchanged)", rank=rank, exact=True)


@given(gather_cases())
def test_all_gather_concatenates_in_rank_order(target, case):
    values, _ = _run(target, "ring_all_gather", case)
    expected = torch.cat([rank_input(case["shape"], case["dtype"], case["seed"], r)
                          for r in range(case["world_size"])])
    for rank, out in enumerate(values):
        harness.assert_close(out["out"], expected, f"ring_all_gather of {_describe(case, 'chunk')}: the result "
                             "should be torch.cat of every rank's chunk along dim 0, in rank order",
                             rank=rank, exact=True)
        harness.assert_close(out["after"], out["input"], f"ring_all_gather of {_describe(case, 'chunk')}: the "
                             "chunk afterwards (it must be left unchanged)", rank=rank, exact=True)


# ---- communication, from the trace -------------------------------------------------------------

def check_ring_peers(trace, ring):
    """Each send goes to the next rank of ``ring`` (global ranks, in ring order), each recv comes from the previous."""
    for i, rank in enumerate(ring):
        right, left = ring[(i + 1) % len(ring)], ring[(i - 1) % len(ring)]
        for op in trace.ops(rank):
            sends = op.kind == "send"
            want = right if sends else left
            harness.check(op.peer == want,
                          f"{op.phase}: rank {rank} {'sent to' if sends else 'received from'} rank {op.peer} "
                          f"(at {op.site}); in the ring {list(ring)} rank {rank} "
                          f"{'sends only to its right' if sends else 'receives only from its left'} neighbour, "
                          f"rank {want}", rank=rank)


@given(cases(), st.integers(1, 8))
def test_ring_neighbours_only(target, case, chunk_rows):
    _, trace = _run_all(target, case, (chunk_rows,))
    check_ring_peers(trace, list(range(case["world_size"])))


@given(cases(), st.integers(0, 8))
def test_bytes_within_ring_bound(target, record_property, case, chunk_rows):
    _, trace = _run_all(target, case, (chunk_rows, 2))
    n, numel, elem = case["world_size"], math.prod(case["shape"]), case["dtype"].itemsize
    per_step = math.ceil(numel / n) * elem
    bounds = {
        "ring_all_reduce": (2 * (n - 1) * per_step, "2(N-1) steps x ceil(numel/N) x elem_size"),
        "ring_reduce_scatter": ((n - 1) * per_step, "(N-1) steps x ceil(numel/N) x elem_size"),
        "ring_all_gather": ((n - 1) * chunk_rows * 2 * elem, "(N-1) steps x one chunk's bytes"),
    }
    for rank in range(n):
        for name, (bound, formula) in bounds.items():
            ops = trace.ops(rank, phase=name)
            if n == 1:
                harness.check(not ops, f"{name} on a single rank issued {len(ops)} ops "
                              f"({ops[0].describe() if ops else ''}): with one rank there is nobody to talk to, "
                              "so it must send nothing", rank=rank)
            sent = sum(op.in_bytes for op in ops if op.kind == "send")
            what = _describe(case) if name != "ring_all_gather" else f"a chunk of shape ({chunk_rows}, 2)"
            harness.check(sent <= bound,
                          f"{name} of {what}: rank {rank} sent {sent} bytes, more than a ring needs: "
                          f"{formula} = {bound} bytes. Each step passes one chunk to the right neighbour, "
                          "never the whole tensor", rank=rank)
    # the all-reduce's figures, for the cost table: from the trace, never from the code's own numbers
    sends = [op for rank in range(n) for op in trace.ops(rank, phase="ring_all_reduce") if op.kind == "send"]
    per_rank, per_link = {}, {}
    for op in sends:
        per_rank[op.rank] = per_rank.get(op.rank, 0) + op.in_bytes
        per_link[(op.rank, op.peer)] = per_link.get((op.rank, op.peer), 0) + op.in_bytes
    model = bounds["ring_all_reduce"][0]
    exact = numel % n == 0   # the closed form is exact when N divides numel: the case moving most such is shown
    cost.record(record_property, f"ring_all_reduce of {_describe(case)}", model if exact else -1,
                bytes_per_rank=(model, max(per_rank.values(), default=0)),
                busiest_link=(model, max(per_link.values(), default=0)),
                messages_per_rank=(2 * (n - 1), max([sum(op.rank == r for op in sends) for r in range(n)])))


# ---- the messages decide the result ----------------------------------------------------------

@st.composite
def whole_number_cases(draw):
    """A float64 all-reduce of at least one element on 2-4 ranks, inputs whole numbers: every sum is exact."""
    world = draw(hs.world_sizes(2))
    numel = draw(hs.numels(world).filter(bool))
    return dict(world_size=world, shape=draw(hs.shapes(numel)), dtype=torch.float64, seed=draw(hs.seeds()))


def whole_number_inputs(case):
    return harness.per_rank(rank_input(case["shape"], torch.int64, case["seed"], r).double()
                            for r in range(case["world_size"]))


def elements(op) -> int:
    """How many elements a message carries."""
    return sum(math.prod(shape) for shape in op.shapes)


def spare_room(case) -> int:
    """How many padding elements a ring may send in one message: chunks padded to ceil(numel/N), as NCCL pads
    them, hold that many elements beyond the tensor's own."""
    n, numel = case["world_size"], math.prod(case["shape"])
    return n * math.ceil(numel / n) - numel


def perturbed_changes(target, case, inputs, plain, rank, k):
    """Runs ring_all_reduce again with +1 added to each element of rank ``rank``'s send #``k``.  Returns that
    send, a description of the experiment, and each rank's flat indices that gained 1; every element must
    gain exactly 0 or 1 (an element is summed once, then copied)."""
    n = case["world_size"]
    changed, trace = harness.run(_invoke, n, target, "ring_all_reduce", inputs, probes=[harness.Perturb(rank, k)])
    marked = [op for op in trace.ops(rank, "send") if op.perturbed]
    harness.check(len(marked) == 1, f"ring_all_reduce of {_describe(case)}: asked to perturb rank {rank}'s "
                  f"send #{k}, but it sent only {len(trace.ops(rank, 'send'))} messages on the second run",
                  rank=rank)
    op = marked[0]
    what = (f"ring_all_reduce of {_describe(case)}, run twice on the same inputs (whole numbers, so every sum is "
            f"exact); the second time +1 was added to each of the {elements(op)} elements of one message, rank "
            f"{rank}'s send #{k}: {op.describe()}")
    moved = {}
    for q in range(n):
        diff = (changed[q]["out"] - plain[q]["out"]).flatten()
        odd = ((diff != 0) & (diff != 1)).nonzero().flatten().tolist()
        harness.check(not odd, f"{what}: the result on rank {q} changed by {diff[odd[0]].item() if odd else 0!r} "
                      f"at flat index {odd[0] if odd else 0}; an element carried by that message gains exactly 1 "
                      "(it is summed once, then copied), every other element stays as it was", rank=q)
        moved[q] = (diff == 1).nonzero().flatten().tolist()
    return op, what, moved


@hs.fewer_examples(0.5)
@given(whole_number_cases(), st.data())
def test_all_reduce_depends_on_its_messages(target, case, data):
    n, inputs, spare = case["world_size"], whole_number_inputs(case), spare_room(case)
    plain, trace = harness.run(_invoke, n, target, "ring_all_reduce", inputs)
    sends = [(rank, k) for rank in range(n) for k, op in enumerate(trace.ops(rank, "send")) if elements(op)]
    harness.check(bool(sends), f"ring_all_reduce of {_describe(case)}: no rank sent a message with any element "
                  "in it; the sum can only reach the other ranks through the ring's messages")
    order = data.draw(st.permutations(sends), label="the sends to perturb, in turn (rank, its k-th send from 0)")
    for rank, k in order:
        op, what, moved = perturbed_changes(target, case, inputs, plain, rank, k)
        carried, got = elements(op), len(moved[op.peer])
        if got == 0 and carried <= spare:
            continue   # a message of padding alone carries nothing: perturb the next one
        harness.check(carried - spare <= got <= carried,
                      f"{what}: on rank {op.peer}, which received it, {got} elements of the result changed, "
                      f"expected the {carried} that message carried (at most {spare} of them may be padding, "
                      f"{n} chunks of ceil({math.prod(case['shape'])}/{n}) elements hold that many beyond the "
                      "tensor's): a ring's messages decide its result (does the data travel some other way, "
                      "with the messages only for show?)", rank=op.peer)
        for q, positions in moved.items():
            harness.check(not positions or positions == moved[op.peer],
                          f"{what}: the result changed at flat indices {positions} on rank {q} but at "
                          f"{moved[op.peer]} on rank {op.peer}; one message carries one set of elements", rank=q)
        return
    harness.check(False, f"ring_all_reduce of {_describe(case)}: +1 was added to each of the {len(sends)} messages "
                  "that carried elements, one per run, and the result changed after none of them: a ring's "
                  "messages decide its result (does the data travel some other way, with the messages only "
                  "for show?)")


# ---- groups ------------------------------------------------------------------------------------

@st.composite
def group_cases(draw):
    case = draw(cases(min_world=2))
    case["members"] = sorted(draw(st.sets(st.integers(0, case["world_size"] - 1), min_size=1)))
    return case


@hs.fewer_examples(0.3)
@given(group_cases(), st.integers(1, 4))
@example(dict(world_size=4, shape=(5,), dtype=torch.float32, seed=0, members=[1, 3]), 2)
def test_sub_group(target, case, chunk_rows):
    members = case["members"]
    values, trace = _run_all(target, case, (chunk_rows,), members)
    total, tolerance = expected_sum(case["shape"], case["dtype"], case["seed"], members)
    gathered = torch.cat([rank_input((chunk_rows,), case["dtype"], case["seed"], r) for r in members])
    for i, rank in enumerate(members):
        expected = {"ring_all_reduce": (total, tolerance),
                    "ring_reduce_scatter": (total.flatten().tensor_split(len(members))[i], tolerance),
                    "ring_all_gather": (gathered, {"exact": True})}
        for name, out in zip(NAMES, values[rank]):
            want, tol = expected[name]
            harness.assert_close(out["out"], want,
                                 f"{name}(x, group) with group = dist.new_group({members}) on {case['world_size']} "
                                 f"ranks: the result on group member {i} (inside a group use dist.get_rank(group), "
                                 "dist.get_world_size(group), and dist.get_global_rank(group, i) for peers)",
                                 rank=rank, **tol)
    for rank in range(case["world_size"]):
        harness.check(rank in members or not trace.ops(rank),
                      f"rank {rank} is outside the group {members} but communicated", rank=rank)
    check_ring_peers(trace, members)
