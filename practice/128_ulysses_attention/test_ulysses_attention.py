"""Problem 128 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); the expected values come from
``F.scaled_dot_product_attention`` on the whole sequence, computed here in the test process in float64, and
what was communicated, on which group, comes from the harness's trace.  Each rank receives only its own shard
of q, k, v (and of the output gradient) (``harness.per_rank``).  The USP grids' process groups are built here,
on the ranks, in one of two layouts, and handed to ``usp_attention``.
"""
from contextlib import ExitStack, contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import example, given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.attention_shards import chunk_of, forward_backward
from testkit.groups import member_group

TOLERANCE = {torch.float64: dict(atol=1e-9, rtol=1e-7), torch.float32: dict(atol=2e-5, rtol=2e-5)}
CALL = ("forward", "backward")     # the phases the learner's code runs in (group set-up runs outside them)


# ---- cases, inputs and the truth -----------------------------------------------------------------------

@st.composite
def ulysses_cases(draw, min_world=1, dtypes=(torch.float64,), members=False):
    """N ranks, H = N x (1 or 2) heads, shards of 1-3 positions; ``members``: a group of some of the ranks."""
    n = draw(hs.world_sizes(min_world))
    group = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1))) if members else None
    ring = len(group) if group else n
    return dict(world_size=n, members=group, batch=draw(st.integers(1, 2)), heads=ring * draw(st.integers(1, 2)),
                chunk=draw(st.integers(1, 3)), dim=draw(st.sampled_from([1, 2, 4])), causal=draw(st.booleans()),
                dtype=draw(st.sampled_from(dtypes)), seed=draw(hs.seeds()))


# (U, R): the 2 x 2 grid (both layouts) first among equals; pure Ulysses and pure ring at the edges
GRIDS = [(2, 2), (2, 2), (1, 3), (3, 1), (2, 1), (1, 2), (1, 1), (4, 1), (1, 4)]
LAYOUTS = ("ulysses-low", "ring-low")


@st.composite
def usp_cases(draw):
    """A U x R grid in one of the two layouts, H = U x (1 or 2) heads."""
    u, r = draw(st.sampled_from(GRIDS))
    return dict(world_size=u * r, ulysses=u, ring=r, layout=draw(st.sampled_from(LAYOUTS)),
                batch=draw(st.integers(1, 2)), heads=u * draw(st.integers(1, 2)), chunk=draw(st.integers(1, 2)),
                dim=draw(st.sampled_from([1, 2, 4])), causal=draw(st.booleans()), dtype=torch.float64,
                seed=draw(hs.seeds()))


def grid(u, r, layout):
    """The USP grid: {global rank: (ring rank i, Ulysses rank j)}, the Ulysses groups, the ring groups.

    ulysses-low: the U ranks of a Ulysses group are consecutive (global rank i*U + j); ring-low: the R ranks of
    a ring group are (global rank j*R + i).  Either way the rank with coordinates (i, j) holds shard i*U + j.
    """
    coords = {(i * u + j if layout == "ulysses-low" else j * r + i): (i, j) for i in range(r) for j in range(u)}
    ulysses = [sorted(g for g, (i, _) in coords.items() if i == row) for row in range(r)]
    rings = [sorted(g for g, (_, j) in coords.items() if j == col) for col in range(u)]
    return coords, ulysses, rings


def shard_of(rank, case):
    """Which shard of the sequence a global rank holds: its own index in Part 1, i*U + j on a USP grid."""
    if "layout" in case:
        i, j = grid(case["ulysses"], case["ring"], case["layout"])[0][rank]
        return i * case["ulysses"] + j
    return (case["members"] or list(range(case["world_size"]))).index(rank)


def holders(case):
    """The global ranks that hold a shard, and so the number of shards."""
    return case["members"] if case.get("members") else list(range(case["world_size"]))


def sequence(case):
    """The whole sequence's q, k, v and an output gradient, [B, H, S, D] in float64, from the seed."""
    gen = torch.Generator().manual_seed(case["seed"])
    shape = (case["batch"], case["heads"], len(holders(case)) * case["chunk"], case["dim"])
    return [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(4)]


def rank_inputs(case, tensors, backward):
    """Each holder gets only its own shard of q, k, v (and of dout for backward); None for the others."""
    q, k, v, dout = (t.to(case["dtype"]) for t in tensors)
    shards, inputs = len(holders(case)), [None] * case["world_size"]
    for rank in holders(case):
        s = shard_of(rank, case)
        inputs[rank] = {"qkv": [chunk_of(t, s, shards) for t in (q, k, v)],
                        "dout": chunk_of(dout, s, shards) if backward else None}
    return harness.per_rank(inputs)


def full_attention(tensors, causal):
    """The single-process truth: SDPA over the whole sequence in float64, and its input gradients."""
    q, k, v, dout = tensors
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(dout.double())
    return out.detach(), [q.grad, k.grad, v.grad]


@contextmanager
def usp_groups(u, r, layout):
    """Inside a rank: every rank creates every Ulysses group, then every ring group; yields this rank's two."""
    _, ulysses, rings = grid(u, r, layout)
    me = dist.get_rank()
    with ExitStack() as stack:
        made = [(stack.enter_context(member_group(ranks))[0], ranks) for ranks in ulysses + rings]
        mine = [group for group, ranks in made if me in ranks]
        yield mine[0], mine[1]


def _attend(target, mine, case):
    """Runs on every rank: the learner's attention on this rank's shard, then, given its ``dout``, backward."""
    with ExitStack() as stack:
        if "layout" in case:
            groups = stack.enter_context(usp_groups(case["ulysses"], case["ring"], case["layout"]))
        else:
            group, _, index = stack.enter_context(member_group(case["members"]))
            if index is None:
                return None

        def attend(q, k, v):
            if "layout" in case:
                return target.load().usp_attention(q, k, v, ulysses_group=groups[0], ring_group=groups[1],
                                                   causal=case["causal"])
            return target.load().ulysses_attention(q, k, v, causal=case["causal"], group=group)
        return forward_backward(mine, attend)


def run(target, case, backward=False):
    """One call per drawn case and pass, shared by the properties that check it (reuse)."""
    return harness.run(_attend, case["world_size"], target, rank_inputs(case, sequence(case), backward), case,
                       reuse=True)


def describe(case):
    shard = [case["batch"], case["heads"], case["chunk"], case["dim"]]
    dtype = str(case["dtype"]).replace("torch.", "")
    if "layout" in case:
        u, r = case["ulysses"], case["ring"]
        return (f"usp_attention(causal={case['causal']}) on a {u} x {r} grid (U = {u} Ulysses ranks x R = {r} ring "
                f"ranks, {case['layout']}), shards of shape {shard} {dtype}")
    where = (f"the group {case['members']} of {case['world_size']} ranks" if case["members"]
             else f"{case['world_size']} rank{'s' * (case['world_size'] > 1)}")
    return f"ulysses_attention(causal={case['causal']}) on {where}, shards of shape {shard} {dtype}"


def rows(case, rank):
    c, s = case["chunk"], shard_of(rank, case)
    return f"sequence positions {s * c}..{s * c + c - 1}"


def check_outputs(values, case, expected):
    shards = len(holders(case))
    for rank in holders(case):
        out = values[rank]["out"]
        harness.check(isinstance(out, torch.Tensor), f"{describe(case)} returned {type(out).__name__}, not a tensor",
                      rank=rank)
        harness.assert_close(out, chunk_of(expected, shard_of(rank, case), shards).to(case["dtype"]),
                             f"{describe(case)}: output rows of {rows(case, rank)} (full attention over the whole "
                             "sequence)", rank=rank, **TOLERANCE[case["dtype"]])


def check_gradients(values, case, expected):
    shards = len(holders(case))
    for rank in holders(case):
        for name, got, want in zip("qkv", values[rank]["grads"], expected):
            harness.check(got is not None, f"{describe(case)}: after backward, {name}.grad is None: gradients must "
                          "reach q, k and v through both all_to_alls", rank=rank)
            harness.assert_close(got, chunk_of(want, shard_of(rank, case), shards),
                                 f"{describe(case)}: the gradient of {name}, {rows(case, rank)} (the full "
                                 "attention's gradient)", rank=rank, **TOLERANCE[case["dtype"]])


def shard_bytes(case):
    """M = B x H x S/N x D x element size: one of q, k, v, out on one rank."""
    return case["batch"] * case["heads"] * case["chunk"] * case["dim"] * case["dtype"].itemsize


def ops_in_call(trace, rank):
    return [op for op in trace.ops(rank) if op.phase in CALL]


def check_exchanges(trace, case, rank, group, phase):
    """Exactly two all_to_all on ``group`` in ``phase``: q, k, v together (3M) then the output (M) in forward;
    their mirrors, dout (M) then dq, dk, dv together (3M), in backward."""
    m = shard_bytes(case)
    want = [3 * m, m] if phase == "forward" else [m, 3 * m]
    ops = trace.ops(rank, "all_to_all", phase=phase)
    listing = "; ".join(f"{op.describe()} on ranks {list(op.group)}" for op in ops) or "none"
    what = ("one all_to_all carrying q, k and v together (3M bytes in), then one carrying the output back (M)"
            if phase == "forward" else
            "the forward's two in reverse: dout (M bytes in) the way the output came, then dq, dk, dv together (3M)")
    harness.check([op.in_bytes for op in ops] == want and all(op.out_bytes == op.in_bytes for op in ops),
                  f"{describe(case)}: {phase} issued these all_to_all: {listing}; with M = B*H*(S/N)*D*element size "
                  f"= {m} bytes, expected {what}: in_bytes {want}", rank=rank)
    harness.check(all(op.group == tuple(group) for op in ops),
                  f"{describe(case)}: {phase} issued {listing}; they run on the Ulysses group {group}", rank=rank)


def forward_figures(trace, rank):
    """The forward's cost figures on ``rank`` from the trace: bytes to the other ranks, the most to one of them,
    and the messages (an all_to_all sends one to each other rank it gives rows to).  An all_to_all without split
    sizes gives each rank of its group an equal share."""
    to = {}
    messages = 0
    for op in trace.ops(rank, "all_to_all", phase="forward"):
        splits = list(op.splits[1]) if op.splits and op.splits[1] else [1] * len(op.group)
        for peer, part in zip(op.group, splits):
            share = op.in_bytes * part // sum(splits) if sum(splits) else 0
            if peer != rank and share:
                to[peer] = to.get(peer, 0) + share
                messages += 1
    return {"bytes_per_rank": sum(to.values()), "busiest_link": max(to.values(), default=0),
            "messages_per_rank": messages}


# ---- Part 1: Ulysses ---------------------------------------------------------------------------------------

def ulysses_example(**changes):
    """3 ranks, 2 heads each, 2 batches, causal: head and batch rows mixed up by a layout bug show here."""
    return example(dict(dict(world_size=3, members=None, batch=2, heads=6, chunk=2, dim=2, causal=True,
                             dtype=torch.float64, seed=0), **changes))


@given(ulysses_cases(dtypes=(torch.float64, torch.float32)))
@ulysses_example()
def test_ulysses_matches_full_attention(target, case):
    values, _ = run(target, case)
    check_outputs(values, case, full_attention(sequence(case), case["causal"])[0])


@hs.fewer_examples(0.3)
@given(ulysses_cases(min_world=2, members=True))
@ulysses_example(world_size=4, members=[1, 3], heads=4)
def test_ulysses_on_a_process_group(target, case):
    values, trace = run(target, case)
    check_outputs(values, case, full_attention(sequence(case), case["causal"])[0])
    for rank in case["members"]:        # (the other ranks never call it)
        for op in ops_in_call(trace, rank):
            harness.check(op.group == tuple(case["members"]), f"{describe(case)}: {op.describe()} ran on ranks "
                          f"{list(op.group)}; pass group= to every collective", rank=rank)


@st.composite
def indivisible_cases(draw):
    """Ulysses on N >= 2 ranks, or USP with U >= 2, and a head count H that N (or U) does not divide."""
    if draw(st.booleans()):
        n = draw(hs.world_sizes(min_size=2))
        case = dict(world_size=n, members=None, split=n)
    else:
        u, r = draw(st.sampled_from([(2, 1), (2, 2), (3, 1), (4, 1)]))
        case = dict(world_size=u * r, ulysses=u, ring=r, layout=draw(st.sampled_from(LAYOUTS)), split=u)
    heads = draw(st.integers(1, 3 * case["split"]).filter(lambda h: h % case["split"]))
    return dict(case, batch=1, heads=heads, chunk=draw(st.integers(1, 2)), dim=2, causal=draw(st.booleans()),
                dtype=torch.float64, seed=draw(hs.seeds()))


def _raises(target, mine, case):
    try:
        _attend(target, mine, case)
    except ValueError as e:
        return str(e)
    return None


@hs.fewer_examples(0.3)
@given(indivisible_cases())
@example(dict(world_size=4, members=None, split=4, batch=1, heads=6, chunk=1, dim=2, causal=False,
              dtype=torch.float64, seed=0))
def test_indivisible_heads_raise_value_error(target, case):
    values, trace = harness.run(_raises, case["world_size"], target, rank_inputs(case, sequence(case), False), case)
    n, h = case["split"], case["heads"]
    call = (f"usp_attention on a {case['ulysses']} x {case['ring']} grid" if "layout" in case
            else f"ulysses_attention on {n} ranks") + f", H = {h} heads"
    for rank, message in enumerate(values):
        harness.check(message is not None, f"{call}: {h} heads cannot be split among the {n} ranks of the Ulysses "
                      "group, but no ValueError was raised", rank=rank)
        harness.check(str(h) in message and str(n) in message,
                      f"{call} raised ValueError({message!r}); the message must name H = {h} and N = {n}", rank=rank)
        ops = ops_in_call(trace, rank)
        harness.check(not ops, f"{call} raised, but only after it communicated ({ops[0].describe() if ops else ''}): "
                      "check the heads before any all_to_all", rank=rank)


@hs.fewer_examples(0.5)
@given(ulysses_cases())
@ulysses_example()
def test_ulysses_gradients_match_full_attention(target, case):
    values, _ = run(target, case, backward=True)
    check_gradients(values, case, full_attention(sequence(case), case["causal"])[1])


@hs.fewer_examples(0.5)
@given(ulysses_cases())
@ulysses_example()
def test_two_all_to_alls_each_way(target, record_property, case):
    _, trace = run(target, case, backward=True)     # the gradients' run, again (reuse)
    n = case["world_size"]
    if n == 1:
        return                                      # nothing to exchange: communicating is free
    m = shard_bytes(case)
    model = {"bytes_per_rank": 4 * m * (n - 1) // n, "busiest_link": 4 * m // n, "messages_per_rank": 2 * (n - 1)}
    for rank in range(n):
        for phase in CALL:
            others = [op for op in trace.ops(rank, phase=phase) if op.kind != "all_to_all"]
            harness.check(not others, f"{describe(case)}: {phase} issued {others[0].describe() if others else ''}; "
                          "Ulysses needs nothing but its two all_to_all each way", rank=rank)
            check_exchanges(trace, case, rank, range(n), phase)
        # the 3M + M bytes in (checked above) fix the bytes per rank and the messages; the head groups being
        # H/N heads each fixes the rest: every other rank gets the same share, 4M/N
        measured = forward_figures(trace, rank)
        harness.check(measured["busiest_link"] == model["busiest_link"],
                      f"{describe(case)}: forward sent {measured['busiest_link']} bytes to one rank; the cost model's "
                      f"busiest link is 4M/N = {model['busiest_link']} bytes (M = {m}): each rank takes a head group "
                      f"of H/N heads, so every rank gets the same share of the 3M and the M", rank=rank)
    worst = {figure: max(forward_figures(trace, r)[figure] for r in range(n)) for figure in model}
    cost.record(record_property, describe(case), 4 * m * n,
                **{figure: (model[figure], worst[figure]) for figure in model})


# ---- Part 2: USP ---------------------------------------------------------------------------------------------

def usp_examples(test):
    """The 2 x 2 grid in both layouts, causal: every bug of the grid shows there."""
    for layout in LAYOUTS:
        test = example(dict(world_size=4, ulysses=2, ring=2, layout=layout, batch=1, heads=2, chunk=2, dim=2,
                            causal=True, dtype=torch.float64, seed=1))(test)
    return test


@hs.fewer_examples(0.5)
@given(usp_cases())
@usp_examples
def test_usp_matches_full_attention(target, case):
    values, _ = run(target, case)
    check_outputs(values, case, full_attention(sequence(case), case["causal"])[0])


@hs.fewer_examples(0.5)
@given(usp_cases())
@usp_examples
def test_usp_gradients_match_full_attention(target, case):
    values, _ = run(target, case, backward=True)
    check_gradients(values, case, full_attention(sequence(case), case["causal"])[1])


@hs.fewer_examples(0.5)
@given(usp_cases())
@usp_examples
def test_usp_communication_stays_in_its_groups(target, case):
    _, trace = run(target, case, backward=True)     # the gradients' run, again (reuse)
    u, r = case["ulysses"], case["ring"]
    coords, ulysses, rings = grid(u, r, case["layout"])
    m = shard_bytes(case)
    for rank, (i, j) in sorted(coords.items()):
        group, ring = ulysses[i], rings[j]
        neighbours = sorted({ring[(i + 1) % r], ring[(i - 1) % r]} - {rank})
        where = f"rank {rank} (ring rank {i} of ring group {ring}, Ulysses rank {j} of Ulysses group {group})"
        for op in ops_in_call(trace, rank):
            if op.is_p2p:
                harness.check(op.peer in neighbours, f"{describe(case)}: {where} issued {op.describe()}; the ring's "
                              f"messages go only to its ring neighbours {neighbours}", rank=rank)
            else:
                harness.check(op.kind == "all_to_all" and op.group == tuple(group),
                              f"{describe(case)}: {where} issued {op.describe()} on ranks {list(op.group)}; the only "
                              f"collectives are the all_to_all of the Ulysses group {group}", rank=rank)
        if u > 1:
            for phase in CALL:
                check_exchanges(trace, case, rank, group, phase)
        sends = trace.ops(rank, "send", phase="forward")
        harness.check(len(sends) == 2 * (r - 1) and all(op.in_bytes == m for op in sends),
                      f"{describe(case)}: {where} sent {[op.in_bytes for op in sends]} bytes in forward; the ring "
                      f"passes its K and V blocks, [B, H/U, U*S/N, D] = {m} bytes each, R - 1 = {r - 1} hops: "
                      f"{2 * (r - 1)} messages of {m} bytes", rank=rank)
