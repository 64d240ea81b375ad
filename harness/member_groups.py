"""A process group of chosen ranks inside a rank function, destroyed on exit.

Call from a rank function, on every rank together::

    with member_group([0, 2]) as (group, members, index):
        if index is None:
            return None          # this rank is outside the group
        ...                      # group: pass it to the code under test; index: its rank in the group

With ``ranks=None`` it yields the default group (``None``) and every rank.  Destroying
the group on exit keeps a pooled world from collecting one group per call.
"""
from __future__ import annotations

from contextlib import contextmanager

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
