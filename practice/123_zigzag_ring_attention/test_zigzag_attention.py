"""Problem 123 properties.  Each test is one line of the statement's list ("What the tests check").

Learner code runs only on the ranks (``harness.run``).  The expected values are causal
``F.scaled_dot_product_attention`` over the whole sequence, computed here in the test process; what
was sent comes from the harness's trace, what a rank keeps from the harness's memory probes, and each
rank's floating-point operations from the harness's FLOP counter around the rank function.  Every
rank receives only its own zigzag shard (``harness.per_rank``).
"""
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import harness
from contiguous_ring import contiguous_causal_attention
from testkit import cost, strategies as hs
from testkit.groups import member_group
from testkit.overlap import check_receives_overlap_compute
from testkit.overlap_cost import hidden_fraction, ring_figures

TIGHT = dict(atol=1e-9, rtol=1e-7)
LARGE_LOGIT = 300.0      # exp(300) is inf in float32
MATMULS_PER_BLOCK = 7    # forward Q Kᵀ and P V; backward Q Kᵀ again, dO Vᵀ, Pᵀ dO, dS K and dSᵀ Q


@st.composite
def cases(draw, min_world=1):
    """Causal attention on N ranks over S = 2N·c positions: chunks of c, shards of 2c."""
    return dict(world=draw(hs.world_sizes(min_world)), batch=draw(st.integers(1, 2)), heads=draw(st.integers(1, 2)),
                chunk=draw(st.integers(1, 3)), dim=draw(st.sampled_from([2, 3, 8])), seed=draw(hs.seeds()))


def sequence(case, ring=None):
    """q, k, v and an output gradient over the whole sequence, [B, H, S, D] float64, from the seed."""
    gen = torch.Generator().manual_seed(case["seed"])
    shape = (case["batch"], case["heads"], 2 * (ring or case["world"]) * case["chunk"], case["dim"])
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(4)]


def zigzag_positions(index, ring, chunk):
    """Sequence positions held at ring position ``index`` of ``ring``: chunk index, then chunk 2N-1-index."""
    return [i * chunk + j for i in (index, 2 * ring - 1 - index) for j in range(chunk)]


def rows(t, positions):
    """Those sequence positions of ``t`` as a new tensor: a rank is never handed a view of the whole sequence."""
    return t[:, :, positions].clone()


def shard_inputs(case, tensors, members):
    """Each member's own zigzag shard of every tensor, as plain numbers (so that identical calls are recognised
    and properties can share a run: ``reuse``); None for ranks outside ``members``."""
    given_to = [None] * case["world"]
    for index, rank in enumerate(members):
        shards = [rows(t, zigzag_positions(index, len(members), case["chunk"])) for t in tensors]
        given_to[rank] = [(str(t.dtype), list(t.shape), t.flatten().tolist()) for t in shards]
    return harness.per_rank(given_to)


def rebuilt(plain):
    """On a rank: the tensor ``shard_inputs`` wrote out, on this rank's device."""
    dtype, shape, values = plain
    return torch.tensor(values, dtype=getattr(torch, dtype.split(".")[1]), device=harness.device()).reshape(shape)


def causal_attention(q, k, v, dout):
    """The truth: causal SDPA over the whole sequence in float64, and its input gradients."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(dout.double())
    return out.detach(), [q.grad, k.grad, v.grad]


def _attend(target, mine, group_ranks=None, measure=False):
    """On every rank: only the learner's attention on its shard, then its backward when ``mine`` has a dout."""
    with member_group(group_ranks) as (group, _, index):
        if index is None:
            return None
        mine = [rebuilt(t) for t in mine]
        backward = len(mine) == 4
        q, k, v = (t.requires_grad_(backward) for t in mine[:3])
        before = harness.live_storages(collect=False) if measure else None
        with harness.phase("forward"), harness.saved_for_backward() as saved:
            out = target.load().zigzag_ring_attention(q, k, v, group=group)
        result = {"out": out.detach() if isinstance(out, torch.Tensor) else out}
        if measure:   # what the rank keeps after forward, beyond its inputs and its output
            held = harness.live_storages(exclude=[before, out], accept=2 * k.numel() * k.element_size() - 1)
            held = held | saved.storages(exclude=[before, out, held])
            result["held"] = [held.nbytes, held.describe()]
        if backward:
            with harness.phase("backward"):
                out.backward(mine[3])
            result["grads"] = [q.grad, k.grad, v.grad]
        return result


def _contiguous(mine):
    return contiguous_causal_attention(*mine)


def training_step(target, case):
    """The run most properties share: forward and backward on every rank, FLOPs counted."""
    tensors = sequence(case)
    result = harness.run(_attend, case["world"], target, shard_inputs(case, tensors, range(case["world"])), reuse=True)
    return tensors, result


def describe(case, members=None, dtype="float64"):
    """The call in words; ``members``: the ring's ranks, when not the whole world."""
    members = list(members if members is not None else range(case["world"]))
    n = len(members)
    on = f"{n} rank{'s' * (n > 1)}" if n == case["world"] else f"the group {members} of {case['world']} ranks"
    return (f"zigzag_ring_attention on {on}, S = {2 * n * case['chunk']} (chunks of c = {case['chunk']}), "
            f"shards [{case['batch']}, {case['heads']}, {2 * case['chunk']}, {case['dim']}] {dtype}")


def check_rows(got, whole, case, members, what, tolerance=TIGHT, dtype="float64"):
    """Each member's tensor equals ``whole`` at the member's zigzag positions."""
    label = describe(case, members, dtype)
    for index, rank in enumerate(members):
        positions = zigzag_positions(index, len(members), case["chunk"])
        harness.check(isinstance(got[rank], torch.Tensor), f"{label}: {what} is {type(got[rank]).__name__}, "
                      "not a tensor", rank=rank)
        harness.check(bool(torch.isfinite(got[rank]).all()), f"{label}: {what} holds inf or NaN", rank=rank)
        harness.assert_close(got[rank], rows(whole, positions).to(got[rank].dtype),
                             f"{label}: {what}, sequence positions {positions}",
                             rank=rank, **tolerance)


def check_messages(trace, case, phase, members, one_way):
    """Every op of ``phase`` is one shard-shaped isend/irecv with a ring neighbour; ``one_way``: all data
    flows the same way round the ring (each rank sends to one neighbour and receives from the other)."""
    n, shard = len(members), [case["batch"], case["heads"], 2 * case["chunk"], case["dim"]]
    first = None
    for index, rank in enumerate(members):
        for op in trace.ops(rank, phase=phase):
            said = f"{describe(case, members)}: in {phase}, rank {rank} issued {op.describe()}"
            harness.check(op.is_p2p and op.peer in members, f"{said}: K and V move by isend/irecv between ring "
                          f"members only, never by a collective", rank=rank)
            hops = (members.index(op.peer) - index) % n
            harness.check(hops in (1, n - 1), f"{said}; its ring neighbours are ranks "
                          f"{members[(index - 1) % n]} and {members[(index + 1) % n]}: one neighbour at a time",
                          rank=rank)
            harness.check([list(s) for s in op.shapes] == [shard] and op.dtypes == ["torch.float64"],
                          f"{said}; every message is one K or V shard (or its gradient), shaped {shard} "
                          "torch.float64: never two stacked, never more of the sequence", rank=rank)
            flow = hops if op.kind == "send" else n - hops    # +1: data moves to the next rank
            first = first or (flow, said)
            harness.check(not one_way or flow == first[0], f"{said}, so its data moves towards the "
                          f"{'next' if flow == 1 else 'previous'} rank, but {first[1]}: K and V travel one way "
                          "round the ring, the same way on every rank", rank=rank)


# ---- Part 1: the layout -------------------------------------------------------------------------

def _shard_every_rank(target, x, world):
    """zigzag_shard(x, rank, world) for rank 0 .. N-1, then -1 and N: a tensor, or the error in words, for each."""
    results = []
    for rank in [*range(world), -1, world]:
        try:
            results.append(target.load().zigzag_shard(x, rank, world))
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001 -- which error it was is the property
            results.append(f"{type(error).__name__}: {error}")
    return results


@given(hs.world_sizes(), st.integers(1, 3), st.integers(1, 12), st.booleans())
def test_zigzag_shard_takes_chunks_r_and_2n_minus_1_minus_r(target, world, chunk, other_length, divisible):
    """zigzag_shard returns chunks r and 2N-1-r, in that order; ValueError when 2N does not divide S, or for a
    rank outside 0..N-1."""
    length = 2 * world * chunk if divisible or other_length % (2 * world) == 0 else other_length
    x = torch.arange(2 * length * 3, dtype=torch.float64).reshape(1, 2, length, 3)
    got = harness.run(_shard_every_rank, 1, target, x, world).values[0]
    for rank, shard in zip([*range(world), -1, world], got):
        call = f"zigzag_shard(x of shape {list(x.shape)}, {rank}, {world})"
        if length % (2 * world) or rank in (-1, world):
            why = (f"S = {length} is not divisible by 2N = {2 * world}" if length % (2 * world) else
                   f"rank {rank} is not one of 0..{world - 1}")
            harness.check(isinstance(shard, str) and shard.startswith("ValueError"),
                          f"{call}: {why}, so it must raise ValueError; it "
                          f"{'raised ' + shard if isinstance(shard, str) else 'returned a value'}")
            continue
        harness.check(not isinstance(shard, str), f"{call} raised {shard}")
        positions = zigzag_positions(rank, world, chunk)
        harness.assert_close(shard, rows(x, positions), f"{call}: expected chunks {rank} and {2 * world - 1 - rank} "
                             f"of {2 * world} (positions {positions})", exact=True)


# ---- Part 2: forward ----------------------------------------------------------------------------

@given(cases())
def test_forward_matches_causal_attention(target, case):
    """The output equals causal attention at this rank's zigzag positions (float64, tight)."""
    tensors, (values, _) = training_step(target, case)
    expected, _ = causal_attention(*tensors)
    check_rows([v["out"] for v in values], expected, case, range(case["world"]), "the output")


@given(cases())
def test_forward_large_logits_float32(target, case):
    """In float32 with logits up to 300: no inf or NaN, and the output matches."""
    q, k, v, _ = sequence(case)
    logits = (q @ k.transpose(-1, -2)).tril()     # the causally visible q·k (D's root does not matter here)
    q = q * (LARGE_LOGIT * case["dim"] ** 0.5 / logits.flatten()[logits.abs().argmax()])
    tensors = [t.float() for t in (q, k, v)]
    values, _ = harness.run(_attend, case["world"], target, shard_inputs(case, tensors, range(case["world"])))
    expected, _ = causal_attention(*tensors, torch.zeros_like(q))
    check_rows([v["out"] for v in values], expected, case, range(case["world"]), f"the output, with logits up to "
               f"{LARGE_LOGIT:g} (exp({LARGE_LOGIT:g}) overflows float32: subtract the running max before exp)",
               dict(atol=2e-3, rtol=2e-3), "float32")


@given(cases())
def test_kv_shards_move_one_hop_at_a_time(target, record_property, case):
    """K/V move one neighbour at a time, one shard per message, 2(N-1) per rank; no collectives."""
    _, (_, trace) = training_step(target, case)
    check_messages(trace, case, "forward", list(range(case["world"])), one_way=True)
    hops, shard_bytes = case["world"] - 1, 8 * case["batch"] * case["heads"] * 2 * case["chunk"] * case["dim"]
    for rank in range(case["world"]):
        for kind in ("send", "recv"):
            count = len(trace.ops(rank, kind, phase="forward"))
            harness.check(count == 2 * hops, f"{describe(case)}: forward issued {count} {kind}s; each of the "
                          f"N-1 = {hops} hops moves one K shard and one V shard ({2 * shard_bytes} B), so "
                          f"{2 * hops}", rank=rank)
    # the cost model: shard-shaped messages (checked above), 2(N-1) of them, all to the downstream neighbour,
    # fix the bytes per rank and the busiest link at 2(N-1) shards: the figures follow from the checks above
    model, measured = 2 * hops * shard_bytes, ring_figures(trace, range(case["world"]), "forward")
    cost.record(record_property, describe(case), model, bytes_per_rank=(model, measured["bytes_per_rank"]),
                busiest_link=(model, measured["busiest_link"]),
                messages_per_rank=(2 * hops, measured["messages_per_rank"]))


@hs.fewer_examples(0.5)
@given(cases(min_world=2))
def test_forward_computes_while_the_next_shard_travels(target, record_property, case):
    """Every forward receive has attention compute (matmul, exp) between its posting and the wait for it."""
    trace = harness.run(_attend, case["world"], target,   # every call of 123 counts compute (problems.yaml: probes)
                        shard_inputs(case, sequence(case)[:3], range(case["world"]))).trace
    check_receives_overlap_compute(trace, range(case["world"]), "forward", describe(case), "K/V shard")
    # so every receive is hidden: the cost model's hidden fraction, 1
    cost.record(record_property, describe(case), case["world"] * case["batch"] * case["heads"] * case["chunk"]
                * case["dim"], hidden_fraction=(1.0, hidden_fraction(trace, range(case["world"]), "forward")))


@hs.fewer_examples(0.1)    # two scans of every live object on each rank: the slowest probe here
@given(cases(min_world=2))
def test_no_rank_holds_the_whole_sequence_kv(target, case):
    """After forward a rank keeps less than one other shard's K and V beyond its own tensors."""
    values, _ = harness.run(_attend, case["world"], target, shard_inputs(case, sequence(case), range(case["world"])),
                            measure=True)
    bound = 2 * 8 * case["batch"] * case["heads"] * 2 * case["chunk"] * case["dim"]
    for rank, value in enumerate(values):
        held, words = value["held"]
        harness.check(held < bound, f"{describe(case)}: after forward the rank keeps {held} B beyond its own q, "
                      f"k, v and output ({words}); one other shard's K and V are {bound} B, and a rank keeps less "
                      "than that: the other shards only pass through (keep q, k, v, out and the row log-sum-exp; "
                      "bring K and V round again in backward)", rank=rank)


@hs.fewer_examples(0.3)
@given(st.data())
def test_runs_on_a_process_group(target, data):
    """It works on a process group of some of the ranks; the others stay silent."""
    case = data.draw(cases(min_world=2))
    members = sorted(data.draw(st.sets(st.integers(0, case["world"] - 1), min_size=1)))
    tensors = sequence(case, len(members))
    values, trace = harness.run(_attend, case["world"], target, shard_inputs(case, tensors[:3], members),
                                group_ranks=members)
    expected, _ = causal_attention(*tensors)
    check_rows([v and v["out"] for v in values], expected, case, members, "the output")
    for rank in set(range(case["world"])) - set(members):
        harness.check(not trace.ops(rank), f"rank {rank} is outside the group {members} but communicated", rank=rank)
    check_messages(trace, case, "forward", members, one_way=True)


# ---- Part 3: backward ---------------------------------------------------------------------------

@given(cases())
def test_backward_matches_causal_attention(target, case):
    """Q.grad, k.grad, v.grad equal causal attention's gradients at the zigzag positions."""
    tensors, (values, _) = training_step(target, case)
    _, grads = causal_attention(*tensors)
    for i, name in enumerate("qkv"):
        check_rows([v["grads"][i] for v in values], grads[i], case, range(case["world"]), f"{name}.grad")


@given(cases())
def test_backward_passes_shards_between_neighbours(target, case):
    """Backward sends only shard-shaped messages to ring neighbours, at most 4N per rank."""
    _, (_, trace) = training_step(target, case)
    check_messages(trace, case, "backward", list(range(case["world"])), one_way=False)
    for rank in range(case["world"]):
        sent = len(trace.ops(rank, "send", phase="backward"))
        harness.check(sent <= 4 * case["world"], f"{describe(case)}: backward sent {sent} messages; K, V and "
                      f"their gradients going round the ring once take at most 4N = {4 * case['world']}", rank=rank)


# ---- Part 4: balance, measured ------------------------------------------------------------------

def block_flops(case, side=None):
    """FLOPs of one matmul of a (side x D) by (D x side) block, over every batch and head."""
    return 2 * case["batch"] * case["heads"] * (side or case["chunk"]) ** 2 * case["dim"]


def in_blocks(flops, case, per_block):
    return f"{flops} FLOPs ({flops / (per_block * block_flops(case)):g} blocks of c x c)"


@given(cases())
def test_attention_flops_are_balanced(target, case):
    """Balance: forward + backward FLOPs, counted by the harness, are equal on every rank."""
    _, result = training_step(target, case)
    flops, n, unit = result.flops, case["world"], MATMULS_PER_BLOCK
    for rank, count in enumerate(flops):
        harness.check(count > 0, f"{describe(case)}: the harness counted no floating-point operations in forward "
                      "and backward: compute the blocks with matmuls (@, torch.matmul, einsum), which torch's "
                      "FlopCounterMode counts", rank=rank)
    most, least = flops.index(max(flops)), flops.index(min(flops))
    harness.check(max(flops) == min(flops), f"{describe(case)}: forward + backward ran "
                  f"{in_blocks(flops[most], case, unit)} on rank {most} but {in_blocks(flops[least], case, unit)} on "
                  f"rank {least}: max/min = {max(flops) / min(flops):.3g}. With the zigzag layout every rank "
                  f"computes 2N+1 = {2 * n + 1} blocks, so the ratio is 1 (a contiguous split's is N to 2N-1)")


@given(cases())
def test_no_fully_masked_block_is_computed(target, case):
    """No wasted blocks: at most (2N+2) * 14 * B*H*c^2*D FLOPs per rank."""
    _, result = training_step(target, case)
    n, unit = case["world"], MATMULS_PER_BLOCK
    bound = (2 * n + 2) * unit * block_flops(case)
    for rank, count in enumerate(result.flops):
        harness.check(count <= bound, f"{describe(case)}: forward + backward ran {in_blocks(count, case, unit)}; "
                      f"only the 2N+1 = {2 * n + 1} blocks with a key chunk at or before the query chunk are needed "
                      f"(the test allows 2N+2 = {2 * n + 2}): skip the blocks the causal mask hides entirely",
                      rank=rank)


@hs.fewer_examples(0.5)
@given(cases(min_world=2))
def test_zigzag_beats_the_contiguous_split(target, case):
    """The contiguous split measures max/min = N; zigzag's is 1 and its slowest rank does less."""
    tensors = sequence(case)
    n, shard = case["world"], 2 * case["chunk"]
    zigzag = harness.run(_attend, n, target, shard_inputs(case, tensors[:3], range(n))).flops
    contiguous = harness.run(_contiguous, n, harness.per_rank(
        [[t[:, :, r * shard:(r + 1) * shard].clone() for t in tensors[:3]] for r in range(n)])).flops
    expected = [(r + 1) * 2 * block_flops(case, shard) for r in range(n)]
    harness.check(contiguous == expected, f"kit defect: the test's contiguous ring counted {contiguous} FLOPs, "
                  f"expected {expected}")
    harness.check(max(contiguous) / min(contiguous) == n > 1, "kit defect: the contiguous split came out balanced")
    harness.check(max(zigzag) == min(zigzag) and max(zigzag) < max(contiguous),
                  f"{describe(case)}: forward FLOPs per rank {zigzag}; 119's contiguous split, skipping the same "
                  f"masked blocks, gives {contiguous} (max/min = N = {n}); zigzag must give every rank the same "
                  f"work, less than the contiguous split's slowest rank ({max(contiguous)})")
