"""Problem 112 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); the expected indices come from
torch's own DistributedSampler, in the test process.
"""
import math
import torch.distributed as dist
from hypothesis import example, given, strategies as st
from torch.utils.data import DistributedSampler, Sampler

import harness
from testkit import cost, strategies as hs


@st.composite
def sampler_cases(draw, num_replicas=None):
    """Sampler arguments; dataset lengths below the replica count and not divisible by it come often."""
    replicas = num_replicas or draw(st.integers(1, 6))
    length = draw(st.one_of(
        st.integers(0, replicas - 1),                    # fewer samples than replicas
        st.integers(1, max(1, (replicas - 1) // 2)),     # so few that padding repeats them more than once
        st.integers(0, 40)))
    return dict(dataset_len=length, num_replicas=replicas, shuffle=draw(st.booleans()), seed=draw(hs.seeds()),
                drop_last=draw(st.booleans()))


def _args(case, rank=None):
    shown = dict(case, rank=rank) if rank is not None else case
    return "ShardSampler(" + ", ".join(f"{k}={v}" for k, v in shown.items()) + ")"


def torch_indices(case, rank, epoch):
    sampler = DistributedSampler(range(case["dataset_len"]), num_replicas=case["num_replicas"], rank=rank,
                                 shuffle=case["shuffle"], seed=case["seed"], drop_last=case["drop_last"])
    sampler.set_epoch(epoch)
    return list(sampler)


def _sample_every_rank(target, case, epochs):
    """Runs on one rank: a sampler per simulated rank; per epoch, what it yields, twice, and its len()."""
    m = target.load()
    out = []
    for rank in range(case["num_replicas"]):
        sampler = m.ShardSampler(rank=rank, **case)
        twin = m.ShardSampler(rank=rank, **case)
        per_epoch = []
        for epoch in epochs:
            sampler.set_epoch(epoch)
            twin.set_epoch(epoch)
            per_epoch.append({"first": [int(i) for i in sampler], "again": [int(i) for i in sampler],
                              "twin": [int(i) for i in twin], "len": len(sampler)})
        out.append({"epochs": per_epoch, "is_sampler": isinstance(sampler, Sampler)})
    return out


def _sample(target, case, epochs):
    return harness.run(_sample_every_rank, 1, target, case, epochs).values[0]


def _first_difference(got, want):
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"first difference at position {i}"


epoch_lists = st.lists(st.integers(0, 1000), min_size=1, max_size=3, unique=True)


@given(sampler_cases(), epoch_lists)
def test_matches_torch_distributed_sampler(target, case, epochs):
    out = _sample(target, case, epochs)
    for rank, per_rank in enumerate(out):
        harness.check(per_rank["is_sampler"], "ShardSampler must subclass torch.utils.data.Sampler")
        for epoch, got in zip(epochs, per_rank["epochs"]):
            want = torch_indices(case, rank, epoch)
            harness.check(got["first"] == want,
                          f"{_args(case, rank)} after set_epoch({epoch}) yielded {got['first']}, but torch's "
                          f"DistributedSampler yields {want} ({_first_difference(got['first'], want)})")


@given(sampler_cases(), epoch_lists)
@example(dict(dataset_len=2, num_replicas=5, shuffle=False, seed=0, drop_last=False), [0])
@example(dict(dataset_len=7, num_replicas=3, shuffle=True, seed=0, drop_last=True), [0])
def test_lengths_equal(target, case, epochs):
    out = _sample(target, case, epochs)
    n, replicas = case["dataset_len"], case["num_replicas"]
    expected = n // replicas if case["drop_last"] else math.ceil(n / replicas)
    rule = (f"drop_last keeps floor({n}/{replicas}) = {expected} per rank" if case["drop_last"] else
            f"padding gives every rank ceil({n}/{replicas}) = {expected}")
    for rank, per_rank in enumerate(out):
        for epoch, got in zip(epochs, per_rank["epochs"]):
            harness.check(len(got["first"]) == expected,
                          f"{_args(case, rank)} after set_epoch({epoch}) yielded {len(got['first'])} indices "
                          f"{got['first']}; every rank must get the same number: {rule}")
            harness.check(got["len"] == expected,
                          f"len({_args(case, rank)}) is {got['len']}, but it yields {expected} indices ({rule})")


@given(sampler_cases(), epoch_lists)
def test_deterministic_for_seed_and_epoch(target, case, epochs):
    out = _sample(target, case, epochs)
    for rank, per_rank in enumerate(out):
        for epoch, got in zip(epochs, per_rank["epochs"]):
            harness.check(got["again"] == got["first"],
                          f"{_args(case, rank)} at epoch {epoch} yielded {got['first']}, then {got['again']} when "
                          "iterated again: the order must depend only on (seed, epoch) -- use your own "
                          "torch.Generator, never the global random state")
            harness.check(got["twin"] == got["first"],
                          f"two samplers {_args(case, rank)} at epoch {epoch} yielded {got['first']} and "
                          f"{got['twin']}: every rank must compute the same shuffle from (seed, epoch)")


@given(sampler_cases(), st.lists(st.integers(0, 1000), min_size=2, max_size=4, unique=True))
# always tried: a shuffled case where torch's order differs between the epochs, whatever else is drawn
@example(dict(dataset_len=12, num_replicas=3, shuffle=True, seed=5, drop_last=False), [0, 1])
def test_epochs_change_the_order(target, case, epochs):
    out = _sample(target, case, epochs)
    for rank, per_rank in enumerate(out):
        orders = [got["first"] for got in per_rank["epochs"]]
        for (e1, o1), (e2, o2) in zip(zip(epochs, orders), zip(epochs[1:], orders[1:])):
            torch_differs = torch_indices(case, rank, e1) != torch_indices(case, rank, e2)
            if case["shuffle"] and torch_differs:
                harness.check(o1 != o2, f"{_args(case, rank)} yielded {o1} at epoch {e1} and again at epoch {e2}: "
                              "set_epoch(e) must reshuffle, with a generator seeded with seed + epoch")
            if not case["shuffle"]:
                harness.check(o1 == o2, f"{_args(case, rank)} yielded {o1} at epoch {e1} but {o2} at epoch {e2}: "
                              "without shuffle every epoch keeps the dataset's order")


BAD_ARGUMENTS = [
    dict(dataset_len=10, num_replicas=2, rank=2), dict(dataset_len=10, num_replicas=3, rank=7),
    dict(dataset_len=10, num_replicas=2, rank=-1), dict(dataset_len=10, num_replicas=0, rank=0),
    dict(dataset_len=10, num_replicas=-2, rank=0), dict(dataset_len=-1, num_replicas=2, rank=0),
]


def _construct(target, kwargs):
    """Runs on one rank: the name of the exception the constructor raised, or None."""
    try:
        target.load().ShardSampler(**kwargs)
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 -- which exception is what the test checks
        return f"{type(e).__name__}: {e}"
    return None


@given(st.sampled_from(BAD_ARGUMENTS), st.booleans())
def test_bad_arguments_raise(target, kwargs, drop_last):
    kwargs = dict(kwargs, drop_last=drop_last)
    raised = harness.run(_construct, 1, target, kwargs).values[0]
    call = "ShardSampler(" + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ")"
    harness.check(raised is not None, f"{call} raised nothing; it must raise ValueError")
    harness.check(raised.startswith("ValueError"), f"{call} raised {raised}; it must raise ValueError")


# ---- on real ranks -----------------------------------------------------------------------------

def _own_shard(target, case, epoch):
    """Runs on every rank: build this rank's own sampler and iterate it.  The shard comes back as the call's
    value, so every op the call's trace holds is the sampler's own."""
    sampler = target.load().ShardSampler(case["dataset_len"], dist.get_world_size(), dist.get_rank(),
                                         shuffle=case["shuffle"], seed=case["seed"], drop_last=case["drop_last"])
    sampler.set_epoch(epoch)
    return [int(i) for i in sampler]


@st.composite
def rank_cases(draw):
    world = draw(hs.world_sizes())
    return world, draw(sampler_cases(num_replicas=world)), draw(st.integers(0, 1000))


@given(rank_cases())
def test_multi_rank_shards_cover_dataset(target, record_property, drawn):
    world, case, epoch = drawn
    shards, trace = harness.run(_own_shard, world, target, case, epoch)
    n = case["dataset_len"]
    call = f"on {world} ranks, each with its own ShardSampler({n}, {world}, rank, shuffle={case['shuffle']}, " \
           f"seed={case['seed']}, drop_last={case['drop_last']}) at epoch {epoch}, the shards were {shards}"
    # the cost model: a sampler computes its shard from (seed, epoch, rank) alone, so it moves nothing
    sent = [op for rank in range(world) for op in trace.ops(rank)]
    for rank in range(world):
        mine = [op for op in sent if op.rank == rank]
        harness.check(not mine, f"{call}: building and iterating the sampler on rank {rank} issued {len(mine)} "
                      f"communication ops ({mine[0].describe() if mine else ''}), {sum(op.in_bytes for op in mine)} "
                      "bytes; the cost model says bytes per rank = 0 and messages per rank = 0: every rank computes "
                      "the same permutation from seed + epoch, so there is nothing to send", rank=rank)
    cost.record(record_property, f"ShardSampler({n}, {world}, rank) at epoch {epoch} on {world} ranks", n * world,
                bytes_per_rank=(0, max((sum(op.in_bytes for op in sent if op.rank == r) for r in range(world)),
                                       default=0)),
                messages_per_rank=(0, max((sum(op.rank == r for op in sent) for r in range(world)), default=0)))
    holders = {}
    for rank, shard in enumerate(shards):
        for i in shard:
            holders.setdefault(i, []).append(rank)
    if case["drop_last"]:
        repeated = {i: r for i, r in holders.items() if len(r) > 1}
        harness.check(not repeated, f"{call}: with drop_last no index may repeat, but "
                      f"{', '.join(f'{i} is on ranks {r}' for i, r in list(repeated.items())[:3])}")
        harness.check(len(holders) == world * (n // world),
                      f"{call}: drop_last should keep {world * (n // world)} distinct indices, kept {len(holders)}")
        return
    missing = sorted(set(range(n)) - set(holders))
    harness.check(not missing, f"{call}: indices {missing[:10]} are on no rank; without drop_last every sample "
                  "must be seen once per epoch")
    padding = world * math.ceil(n / world) - n
    extra = sum(len(r) - 1 for r in holders.values())
    repeats = ", ".join(f"{i} on ranks {r}" for i, r in holders.items() if len(r) > 1)
    harness.check(extra == padding,
                  f"{call}: {extra} extra copies of indices ({repeats}), but only the {padding} padding indices may "
                  "repeat: apart from them the shards must be disjoint")
