"""Takes its rank, ring size and neighbours from the default group (dist.get_rank()), not from ``group``."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_runs_on_a_process_group"


class WorldRing(Ring):
    def __init__(self, group=None):
        self.group, self.rank, self.size = group, dist.get_rank(), dist.get_world_size()
        self.downstream, self.upstream = (self.rank + 1) % self.size, (self.rank - 1) % self.size


class WorldRanks(ZigzagAttention):
    def forward(self, ring, *tensors):
        return super().forward(WorldRing(ring.group), *tensors)

    def backward(self, ring, *tensors):
        return super().backward(WorldRing(ring.group), *tensors)


def zigzag_ring_attention(q, k, v, group=None):
    return WorldRanks()(q, k, v, group)
