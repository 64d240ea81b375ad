"""schedule_gpipe runs the backwards in forward order (B0 first), not in reverse micro-batch order."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_gpipe_is_all_forwards_then_all_backwards"


def schedule_gpipe(num_stages, num_microbatches):
    ops = [("F", i) for i in range(num_microbatches)] + [("B", i) for i in range(num_microbatches)]
    return [list(ops) for _ in range(num_stages)]
