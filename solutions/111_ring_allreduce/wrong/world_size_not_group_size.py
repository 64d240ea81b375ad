"""Sizes the ring with dist.get_world_size(), the whole world, instead of the group's size."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_sub_group"


class _Ring(ref._Ring):
    def __init__(self, group=None):
        super().__init__(group)
        self.n = dist.get_world_size()
        self.right = dist.get_global_rank(self.group, (self.rank + 1) % self.n)
        self.left = dist.get_global_rank(self.group, (self.rank - 1) % self.n)


def ring_all_reduce(tensor, group=None):
    return ref._all_reduce(tensor, _Ring(group))
