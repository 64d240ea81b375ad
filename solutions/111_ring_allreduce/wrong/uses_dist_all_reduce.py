"""Calls dist.all_reduce instead of building the ring from point-to-point ops."""
import torch.distributed as dist

from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_all_reduce_sums"


def ring_all_reduce(tensor, group=None):
    dist.all_reduce(tensor, group=group)
    return tensor
