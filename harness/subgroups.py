"""Process groups inside a rank function: tensor or pipeline parallelism nested inside data parallelism.

Call from a rank function, on every rank together::

    with contiguous_groups(2) as (group, ranks, index):
        ...  # group: this rank's group of 2 consecutive ranks; index: which group it is

The groups are destroyed on exit, so a pooled world does not collect one per call.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch.distributed as dist

from .member_groups import member_group


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
