"""Process groups inside a rank function, destroyed on exit so a pooled world does not collect one per call.

Call from a rank function, on every rank together.  A group of chosen ranks::

    with member_group([0, 2]) as (group, members, index):
        if index is None:
            return None          # this rank is outside the group
        ...                      # group: pass it to the code under test; index: its rank in the group

With ``ranks=None`` it yields the default group (``None``) and every rank.

Tensor or pipeline parallelism nested inside data parallelism, as blocks of consecutive ranks::

    with contiguous_groups(2) as (group, ranks, index):
        ...  # group: this rank's group of 2 consecutive ranks; index: which group it is
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch.distributed as dist


@contextmanager
def member_group(ranks=None):
    """Yield (group, its global ranks in group-rank order, this rank's index in it or None)."""
    if ranks is None:
        members = list(range(dist.get_world_size()))
        yield None, members, dist.get_rank()
        return
    members = sorted(ranks)
    group = dist.new_group(members)
    try:
        yield group, members, members.index(dist.get_rank()) if dist.get_rank() in members else None
    finally:
        if group is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(group)


def group_layout(world_size: int, size: int) -> list[list[int]]:
    """The global ranks of each group: consecutive blocks of ``size`` ranks."""
    if size < 1 or world_size % size:
        raise ValueError(f"cannot split {world_size} ranks into groups of {size}")
    return [list(range(start, start + size)) for start in range(0, world_size, size)]


def positions(world_size: int, size: int) -> dict:
    """Global rank -> (its group's index, its rank inside that group)."""
    return {rank: (i, ranks.index(rank)) for i, ranks in enumerate(group_layout(world_size, size)) for rank in ranks}


@contextmanager
def contiguous_groups(size: int):
    """Yield (this rank's group, its global ranks, the group's index).  Every rank must enter together."""
    layout = group_layout(dist.get_world_size(), size)
    index = dist.get_rank() // size
    with ExitStack() as stack:  # every rank creates every group, in the same order, as new_group requires
        groups = [stack.enter_context(member_group(ranks))[0] for ranks in layout]
        yield groups[index], layout[index], index
