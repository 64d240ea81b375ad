"""Divides each micro-batch's loss by the number of F ops, m*v (118's rule with one chunk), instead of by m."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_run_matches_single_process"


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    v = len(chunks)
    return ref.run_interleaved(chunks, schedule, microbatches, act_shape, lambda out, y: loss_fn(out, y) / v, group)
