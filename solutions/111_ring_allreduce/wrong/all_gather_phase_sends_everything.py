"""The all-gather phase forwards the whole tensor at every step, although the neighbour needs one chunk of it."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_bytes_within_ring_bound"


def ring_all_reduce(tensor, group=None):
    ring = ref._Ring(group)
    flat = tensor.flatten().clone()
    chunks = list(flat.tensor_split(ring.n))
    ref._reduce_scatter_phase(chunks, ring)
    for s in range(ring.n - 1):
        incoming = torch.empty_like(flat)
        ring.exchange(flat, incoming)
        i = (ring.rank - s - 1) % ring.n
        chunks[i].copy_(incoming.tensor_split(ring.n)[i])
    tensor.copy_(flat.view_as(tensor))
    return tensor
