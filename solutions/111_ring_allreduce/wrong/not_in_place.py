"""ring_all_reduce returns the sum in a new tensor and leaves the caller's tensor as it was."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_all_reduce_sums"


def ring_all_reduce(tensor, group=None):
    return ref.ring_all_reduce(tensor.clone(), group)
