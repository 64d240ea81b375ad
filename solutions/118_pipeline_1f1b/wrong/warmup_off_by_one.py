"""Warms up with num_stages - s forwards instead of num_stages - s - 1."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_1f1b_is_the_canonical_order"


def schedule_1f1b(num_stages, num_microbatches):
    return [ref._stage_ops(num_microbatches, min(num_stages - s, num_microbatches)) for s in range(num_stages)]
