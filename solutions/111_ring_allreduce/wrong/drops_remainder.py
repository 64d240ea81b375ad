"""Cuts the tensor into N chunks of numel // N elements, so the last numel % N elements are never summed."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_all_reduce_sums"


def _chunks(flat, n):
    size = flat.numel() // n
    return list(flat[:size * n].split(size)) if size else [flat[:0]] * n


def ring_all_reduce(tensor, group=None):
    ring = ref._Ring(group)
    flat = tensor.flatten().clone()
    chunks = _chunks(flat, ring.n)
    ref._reduce_scatter_phase(chunks, ring)
    ref._all_gather_phase(chunks, ring)
    tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_reduce_scatter(tensor, group=None):
    ring = ref._Ring(group)
    chunks = _chunks(tensor.flatten().clone(), ring.n)
    ref._reduce_scatter_phase(chunks, ring)
    return chunks[ring.rank].clone()
