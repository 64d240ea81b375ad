"""Problem 119 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); the expected values come from
``F.scaled_dot_product_attention`` on the whole sequence, computed here in the test
process, and what was sent, to whom, comes from the harness's trace.  Each rank receives only its own
chunks (``harness.per_rank``).
"""
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.attention_shards import chunk_of, forward_backward
from testkit.groups import member_group
from testkit.overlap import check_receives_overlap_compute
from testkit.overlap_cost import hidden_fraction, ring_figures

F64 = dict(atol=1e-9, rtol=1e-7)
LARGE_LOGIT = 300.0      # exp(300) overflows float32 (and float64 stays exact enough to compare with)


@st.composite
def cases(draw, min_world=1, causal=st.booleans(), chunk=st.integers(1, 3)):
    """One attention problem: the sequence is world_size chunks of ``chunk`` positions each."""
    return dict(world_size=draw(hs.world_sizes(min_world)), batch=draw(st.integers(1, 2)),
                heads=draw(st.integers(1, 2)), chunk=draw(chunk), dim=draw(st.sampled_from([1, 2, 3, 8])),
                causal=draw(causal), seed=draw(hs.seeds()))


def sequence(case, members=None):
    """The whole sequence's q, k, v and an output gradient, [B, H, S, D] in float64, from the seed."""
    ring = len(members) if members else case["world_size"]
    gen = torch.Generator().manual_seed(case["seed"])
    shape = (case["batch"], case["heads"], ring * case["chunk"], case["dim"])
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(4)]


def rank_inputs(case, tensors, backward=False, members=None):
    """What each rank receives: its own chunks of q, k, v (and of dout, for backward); None outside the ring.

    A rank never sees another rank's chunk, so it can only learn the rest of the sequence from its ring
    neighbours' messages.
    """
    members = members or list(range(case["world_size"]))
    q, k, v, dout = tensors
    inputs = [None] * case["world_size"]
    for index, rank in enumerate(members):
        inputs[rank] = {"qkv": [chunk_of(t, index, len(members)) for t in (q, k, v)],
                        "dout": chunk_of(dout, index, len(members)) if backward else None}
    return harness.per_rank(inputs)


def _attend(target, mine, causal, group_ranks=None):
    """Runs on every rank: ring attention on this rank's chunk, then, given its ``dout``, backward."""
    with member_group(group_ranks) as (group, members, index):
        if index is None:
            return None

        def attend(q, k, v):
            return target.load().ring_attention(q, k, v, causal=causal, group=group)
        return forward_backward(mine, attend)


def run(target, case, tensors, backward=False, members=None, **options):
    return harness.run(_attend, case["world_size"], target, rank_inputs(case, tensors, backward, members),
                       case["causal"], group_ranks=members, **options)


def full_attention(q, k, v, dout, causal):
    """The single-process truth: SDPA over the whole sequence in float64, and its input gradients."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(dout.double())
    return out.detach(), [q.grad, k.grad, v.grad]


def chunk_bytes(case):
    """One K or V chunk, [B, H, S/N, D] float64: what every forward message carries."""
    return case["batch"] * case["heads"] * case["chunk"] * case["dim"] * 8


def describe(case, dtype=torch.float64, members=None):
    ring = len(members) if members else case["world_size"]
    shape = [case["batch"], case["heads"], case["chunk"], case["dim"]]
    where = f"the group {members} of {case['world_size']} ranks" if members else f"{ring} rank{'s' * (ring > 1)}"
    return f"ring_attention(causal={case['causal']}) on {where}, chunks of shape {shape} {dtype}"


def check_outputs(values, case, expected, dtype=torch.float64, tolerance=F64, members=None, note=""):
    c = case["chunk"]
    for index, rank in enumerate(members or range(case["world_size"])):
        out = values[rank]["out"]
        harness.check(isinstance(out, torch.Tensor), f"{describe(case, dtype, members)} returned "
                      f"{type(out).__name__}, not a tensor", rank=rank)
        if out.is_floating_point():
            harness.check(bool(torch.isfinite(out).all()),
                          f"{describe(case, dtype, members)}: the output holds inf or NaN{note}", rank=rank)
        harness.assert_close(out, chunk_of(expected, index, expected.shape[2] // c).to(dtype),
                             f"{describe(case, dtype, members)}: output rows of query positions "
                             f"{index * c}..{index * c + c - 1} (full attention over the gathered sequence)",
                             rank=rank, **tolerance)


def check_gradients(values, case, expected_grads, members=None):
    for index, rank in enumerate(members or range(case["world_size"])):
        for name, got, want in zip("qkv", values[rank]["grads"], expected_grads):
            harness.check(got is not None, f"{describe(case, members=members)}: after backward, {name}.grad is "
                          f"None: gradients must reach q, k and v (Part 2)", rank=rank)
            harness.assert_close(got, chunk_of(want, index, want.shape[2] // case["chunk"]),
                                 f"{describe(case, members=members)}: gradient of {name} chunk {index} "
                                 f"(the full attention's gradient, sequence positions {index * case['chunk']}.."
                                 f"{index * case['chunk'] + case['chunk'] - 1})", rank=rank, **F64)


def check_ring_traffic(trace, case, phase, members=None, one_way=True):
    """Every op of ``phase`` is one chunk-shaped message to or from a ring neighbour.

    ``one_way``: the messages also flow one way round the ring, the same way on every rank: each rank sends to
    one neighbour and receives from the other (either direction, as long as every rank agrees).
    """
    members = members or list(range(case["world_size"]))
    shape = (case["batch"], case["heads"], case["chunk"], case["dim"])
    direction = None     # (+1: towards the next rank, -1: towards the previous one; the op that set it)
    for i, rank in enumerate(members):
        nxt, prev = members[(i + 1) % len(members)], members[(i - 1) % len(members)]
        for op in trace.ops(rank, phase=phase):
            what = f"{phase}: rank {rank} issued {op.describe()}"
            harness.check(op.peer in (nxt, prev), f"{what}; in the ring {members}, rank {rank} may only talk to "
                          f"its neighbours {sorted({nxt, prev})}", rank=rank)
            if one_way:
                flow = +1 if op.peer == (nxt if op.kind == "send" else prev) else -1
                if direction is None:
                    direction = (flow, what)
                harness.check(flow == direction[0],
                              f"{what}, so its data flows towards the {'next' if flow > 0 else 'previous'} rank; "
                              f"but {direction[1]}, whose data flows towards the "
                              f"{'next' if direction[0] > 0 else 'previous'} rank. K and V move one way round the "
                              f"ring {members}, the same way on every rank: each rank sends only to one neighbour "
                              "and receives only from the other", rank=rank)
            harness.check(op.shapes == [shape] and op.dtypes == ["torch.float64"],
                          f"{what}; every message must be ONE K or V chunk (or its gradient), shaped {list(shape)} "
                          "torch.float64: send K and V as separate tensors, never the whole sequence", rank=rank)


# ---- Part 1: forward ---------------------------------------------------------------------------

def check_forward(target, case):
    tensors = sequence(case)
    values, _ = run(target, case, tensors)
    expected, _ = full_attention(*tensors, case["causal"])
    check_outputs(values, case, expected)


@given(cases())
def test_forward_matches_full_attention(target, case):
    check_forward(target, case)


@given(cases())
def test_forward_large_logits_float32(target, case):
    q, k, v, dout = sequence(case)
    logits = q @ k.transpose(-1, -2) / case["dim"] ** 0.5
    if case["causal"]:
        logits = logits.masked_fill(torch.ones(logits.shape[-2:], dtype=torch.bool).triu(1), float("nan"))
    top, bottom = float(logits.nan_to_num(-torch.inf).max()), float(logits.nan_to_num(torch.inf).min())
    q = q * (LARGE_LOGIT / top if top > 0 else -LARGE_LOGIT / bottom)   # the largest visible logit: LARGE_LOGIT
    tensors = [t.float() for t in (q, k, v, dout)]
    values, _ = run(target, case, tensors)
    expected, _ = full_attention(*tensors, case["causal"])
    check_outputs(values, case, expected, torch.float32, dict(atol=2e-3, rtol=2e-3),
                  note=f" with logits up to {LARGE_LOGIT:g}: exp({LARGE_LOGIT:g}) overflows float32, so subtract the "
                       "running max before exp, and rescale what was summed when the max grows")


@given(cases(min_world=2, causal=st.just(True)))
def test_causal_mask_at_chunk_borders(target, case):
    check_forward(target, case)


@given(cases(chunk=st.just(1)))
def test_chunks_of_length_one(target, case):
    check_forward(target, case)


@given(cases())
def test_forward_passes_kv_chunks_one_way_round_the_ring(target, case):
    _, trace = run(target, case, sequence(case))
    check_ring_traffic(trace, case, "forward")


@hs.fewer_examples(0.5)
@given(cases(min_world=2, causal=st.just(False)))
def test_forward_computes_while_the_next_chunk_travels(target, record_property, case):
    _, trace = run(target, case, sequence(case))   # every call of 119 counts compute (problems.yaml: probes)
    ranks = range(case["world_size"])
    check_receives_overlap_compute(trace, ranks, "forward", describe(case), "chunk")
    # the check above fixes the hidden fraction at 1: every receive had attention compute behind it
    cost.record(record_property, describe(case), chunk_bytes(case) * case["world_size"],
                hidden_fraction=(1.0, hidden_fraction(trace, ranks, "forward")))


@hs.fewer_examples(0.5)
@given(cases())
def test_forward_passes_kv_n_minus_1_times(target, record_property, case):
    _, trace = run(target, case, sequence(case))
    n = case["world_size"]
    for rank in range(n):
        for kind in ("send", "recv"):
            ops = trace.ops(rank, kind, phase="forward")
            harness.check(len(ops) == 2 * (n - 1),
                          f"{describe(case)}: forward issued {len(ops)} {kind}s; K and V each make N-1 = {n - 1} "
                          f"hops (after N-1 hops every rank has seen every chunk), so expected {2 * (n - 1)}",
                          rank=rank)
    # the cost model: 2(N-1) messages of one chunk each, all to the same neighbour (the ring goes one way)
    model = 2 * (n - 1) * chunk_bytes(case)
    for rank in range(n):
        measured = ring_figures(trace, [rank], "forward")
        for figure, what in (("bytes_per_rank", "sent in all"), ("busiest_link", "sent to one neighbour")):
            harness.check(measured[figure] == model,
                          f"{describe(case)}: forward {what} {measured[figure]} bytes; the cost model's "
                          f"{figure.replace('_', ' ')} is 2(N-1) · B·H·(S/N)·D · elem_size = {model} bytes: "
                          "K and V each pass one chunk per hop, N-1 hops, to the next rank only", rank=rank)
    measured = ring_figures(trace, range(n), "forward")
    cost.record(record_property, describe(case), model,
                bytes_per_rank=(model, measured["bytes_per_rank"]), busiest_link=(model, measured["busiest_link"]),
                messages_per_rank=(2 * (n - 1), measured["messages_per_rank"]))


@hs.fewer_examples(0.3)
@given(st.data())
def test_runs_on_a_process_group(target, data):
    case = data.draw(cases(min_world=2))
    members = sorted(data.draw(st.sets(st.integers(0, case["world_size"] - 1), min_size=1)))
    tensors = sequence(case, members)
    values, trace = run(target, case, tensors, members=members)
    expected, _ = full_attention(*tensors, case["causal"])
    check_outputs(values, case, expected, members=members)
    for rank in range(case["world_size"]):
        harness.check(rank in members or not trace.ops(rank),
                      f"rank {rank} is outside the group {members} but communicated", rank=rank)
    check_ring_traffic(trace, case, "forward", members)


# ---- Part 2: backward --------------------------------------------------------------------------

@hs.fewer_examples(0.5)
@given(cases())
def test_backward_matches_full_attention(target, case):
    tensors = sequence(case)
    values, _ = run(target, case, tensors, backward=True)
    _, grads = full_attention(*tensors, case["causal"])
    check_gradients(values, case, grads)


@hs.fewer_examples(0.5)
@given(cases())
def test_backward_rotates_around_the_ring(target, case):
    _, trace = run(target, case, sequence(case), backward=True)
    check_ring_traffic(trace, case, "backward", one_way=False)
    n = case["world_size"]
    for rank in range(n):
        sent = trace.ops(rank, "send", phase="backward")
        harness.check(len(sent) <= 4 * n,
                      f"{describe(case)}: backward sent {len(sent)} messages; rotating K, V and their gradients dK, "
                      f"dV round the ring takes at most 4N = {4 * n}", rank=rank)
