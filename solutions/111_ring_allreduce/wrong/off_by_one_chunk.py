"""The reduce-scatter phase indexes chunks one off: rank r ends up owning chunk r+1 but uses it as chunk r."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_reduce_scatter_returns_own_chunk"


def _reduce_scatter_phase(chunks, ring):
    for s in range(ring.n - 1):
        target = chunks[(ring.rank - s - 1) % ring.n]
        incoming = torch.empty_like(target)
        ring.exchange(chunks[(ring.rank - s) % ring.n], incoming)
        target += incoming


def ring_all_reduce(tensor, group=None):
    ring = ref._Ring(group)
    flat = tensor.flatten().clone()
    chunks = list(flat.tensor_split(ring.n))
    _reduce_scatter_phase(chunks, ring)
    ref._all_gather_phase(chunks, ring)
    tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_reduce_scatter(tensor, group=None):
    ring = ref._Ring(group)
    chunks = list(tensor.flatten().clone().tensor_split(ring.n))
    _reduce_scatter_phase(chunks, ring)
    return chunks[ring.rank].clone()
