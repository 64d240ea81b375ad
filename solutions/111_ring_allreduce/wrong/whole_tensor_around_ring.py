"""Passes whole tensors around the ring; each rank adds the others' tensors in its own order."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_all_reduce_identical_on_every_rank"


def ring_all_reduce(tensor, group=None):
    ring = ref._Ring(group)
    passing = tensor.clone()
    for _ in range(ring.n - 1):
        incoming = torch.empty_like(passing)
        ring.exchange(passing, incoming)
        tensor += incoming
        passing = incoming
    return tensor
