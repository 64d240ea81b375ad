"""Megatron's 3D rank grid, and where a rank's parameters sit in the full model (problem 124's tests).

    global rank = pp_rank * dp * tp + dp_rank * tp + tp_rank      (tp fastest, then dp, then pp)

``grid_groups`` builds that grid's process groups inside a rank function (the tests hand
them to ``Parallel3D``, so a wrong ``make_groups`` fails only its own property).  The
``Placement`` helpers map a rank's parameters back to entries of the full model by
value: the tests fill the full model with values that are all distinct, so whatever
layout a rank chooses (split, flat, transposed), each entry it holds names one place.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from harness import assert_close, check


def factorisations(n: int) -> list:
    """Every (dp, tp, pp) with dp * tp * pp == n."""
    return [(d, t, n // (d * t)) for d in range(1, n + 1) for t in range(1, n + 1) if n % (d * t) == 0]


def coords(rank: int, dp: int, tp: int, pp: int) -> tuple:
    """(dp_rank, tp_rank, pp_rank) of a global rank."""
    return (rank // tp) % dp, rank % tp, rank // (dp * tp)


def rank_at(d: int, t: int, p: int, dp: int, tp: int) -> int:
    return p * dp * tp + d * tp + t


def layout(kind: str, dp: int, tp: int, pp: int) -> list:
    """The global ranks of every group of one kind ("dp", "tp" or "pp"), each list in group-rank order."""
    if kind == "tp":
        return [[rank_at(d, t, p, dp, tp) for t in range(tp)] for p in range(pp) for d in range(dp)]
    if kind == "dp":
        return [[rank_at(d, t, p, dp, tp) for d in range(dp)] for p in range(pp) for t in range(tp)]
    return [[rank_at(d, t, p, dp, tp) for p in range(pp)] for d in range(dp) for t in range(tp)]


def group_of(kind: str, rank: int, dp: int, tp: int, pp: int) -> list:
    return next(ranks for ranks in layout(kind, dp, tp, pp) if rank in ranks)


@contextmanager
def grid_groups(dp: int, tp: int, pp: int):
    """Rank side: yield {"dp": group, "tp": group, "pp": group} of this rank; every group is destroyed on exit."""
    import torch.distributed as dist
    rank, made, mine = dist.get_rank(), [], {}
    try:
        for kind in ("tp", "dp", "pp"):
            for ranks in layout(kind, dp, tp, pp):
                group = dist.new_group(ranks)
                made.append(group)
                if rank in ranks:
                    mine[kind] = group
        yield mine
    finally:
        for group in made:
            if group is not dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)


def drop_groups(*groups):
    """Rank side: destroy each distinct process group the code under test returned (never the default group)."""
    import torch.distributed as dist
    seen = set()
    for group in groups:
        if group is None or id(group) in seen or group is dist.group.WORLD:
            continue
        seen.add(id(group))
        if group is not dist.GroupMember.NON_GROUP_MEMBER:
            try:
                dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 -- not a group we can destroy: leave it
                pass


def distinct_full_model(blocks: int, d: int, hidden: int, seed: int) -> dict:
    """name -> float64 tensor of the full model, every value distinct: blocks.{b}.fc{1,2}.{weight,bias}."""
    shapes = {}
    for b in range(blocks):
        shapes.update({f"blocks.{b}.fc1.weight": (hidden, d), f"blocks.{b}.fc1.bias": (hidden,),
                       f"blocks.{b}.fc2.weight": (d, hidden), f"blocks.{b}.fc2.bias": (d,)})
    total = sum(torch.Size(s).numel() for s in shapes.values())
    gen = torch.Generator().manual_seed(seed)
    size = (torch.randperm(total, generator=gen, dtype=torch.float64) + 1) / total
    sign = torch.randint(0, 2, (total,), generator=gen, dtype=torch.float64) * 2 - 1
    values, out, offset = size * sign, {}, 0
    for name, shape in shapes.items():
        n = torch.Size(shape).numel()
        out[name] = values[offset:offset + n].reshape(shape).clone()
        offset += n
    return out


def shard_index(name: str, shape: tuple, t: int, tp: int) -> torch.Tensor:
    """Flat indices of the entries of full tensor ``name`` that tensor-parallel rank t holds."""
    index = torch.arange(torch.Size(shape).numel()).reshape(shape)
    k = shape[0] // tp if name.endswith("fc1.weight") or name.endswith("fc1.bias") else None
    if k is not None:
        return index[t * k:(t + 1) * k].reshape(-1)
    if name.endswith("fc2.weight"):
        k = shape[1] // tp
        return index[:, t * k:(t + 1) * k].reshape(-1)
    return index.reshape(-1)          # fc2.bias: whole, on every tensor-parallel rank


class Placement:
    """Where each entry of a rank's parameters sits in the full model, found by value at construction."""

    def __init__(self, full: dict, held: list, rank: int):
        where = {}
        for name, t in full.items():
            for i, v in enumerate(t.flatten().tolist()):
                where[v] = (name, i)
        self.full, self.rank = full, rank
        self.places = []                     # per parameter: [(name, flat index)] for each of its entries
        self.count = {name: torch.zeros(t.numel(), dtype=torch.long) for name, t in full.items()}
        for j, h in enumerate(held):
            found = [where.get(v) for v in h.flatten().tolist()]
            missing = sum(f is None for f in found)
            check(missing == 0, f"parameter {j} of Parallel3D (shape {list(h.shape)}) holds {missing} values that "
                                "are in none of the full blocks' weights and biases: a parameter must be a copy of "
                                "entries of the full blocks", rank=rank)
            self.places.append(found)
            for name, i in found:
                self.count[name][i] += 1

    def check_exactly(self, mine: dict, what: str):
        """Every entry of ``mine[name]`` (flat indices) held once, and nothing of any other full tensor."""
        for name, t in self.full.items():
            own = torch.zeros(t.numel(), dtype=torch.bool)
            if name in mine:
                own[mine[name]] = True
            count = self.count[name]
            lost = int((own & (count == 0)).sum())
            check(lost == 0, f"{what}: {lost} of the {int(own.sum())} entries of {name} this rank must hold are "
                             "in none of its parameters", rank=self.rank)
            extra = int((~own & (count > 0)).sum())
            check(extra == 0, f"{what}: its parameters hold {extra} entries of {name}, which belong to "
                              f"{'another stage' if not own.any() else 'another tensor-parallel rank'}: keep only "
                              "this rank's shard of its own stage's blocks", rank=self.rank)
            twice = int((count > 1).sum())
            check(twice == 0, f"{what}: its parameters hold {twice} entries of {name} more than once", rank=self.rank)

    def check_values(self, final: list, trained: dict, what: str, atol: float, rtol: float):
        """Each parameter's entries now equal the trained full model's entries they started as."""
        check(len(final) == len(self.places), f"{what}: Parallel3D had {len(self.places)} parameters after "
                                               f"construction and {len(final)} after training", rank=self.rank)
        for j, (got, places) in enumerate(zip(final, self.places)):
            want = torch.tensor([trained[name].flatten()[i].item() for name, i in places], dtype=torch.float64)
            names = sorted({name for name, _ in places})
            assert_close(got.detach().to(torch.float64).flatten(), want,
                         f"{what}: parameter {j} (entries of {', '.join(names)})", rank=self.rank,
                         atol=atol, rtol=rtol)
