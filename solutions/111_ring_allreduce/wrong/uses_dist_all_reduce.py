"""Calls dist.all_reduce instead of building the ring from point-to-point ops."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
ring_reduce_scatter, ring_all_gather = ref.ring_reduce_scatter, ref.ring_all_gather
REJECTED_BY = "test_all_reduce_sums"


def ring_all_reduce(tensor, group=None):
    dist.all_reduce(tensor, group=group)
    return tensor
