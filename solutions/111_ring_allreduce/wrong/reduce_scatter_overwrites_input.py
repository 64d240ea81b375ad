"""ring_reduce_scatter sums inside the caller's tensor, which comes back overwritten with partial sums."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_reduce_scatter_returns_own_chunk"


def ring_reduce_scatter(tensor, group=None):
    ring = ref._Ring(group)
    chunks = list(tensor.view(-1).tensor_split(ring.n))
    ref._reduce_scatter_phase(chunks, ring)
    return chunks[ring.rank].clone()
