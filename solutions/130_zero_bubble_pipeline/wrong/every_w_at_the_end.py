"""schedule_zb_h1 defers every W to the end of the stage (the ZB-H2 direction): fewer bubbles, but each stage
holds all m micro-batches' activations until its W's run."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_peak_memory_no_higher_than_1f1b"


def schedule_zb_h1(num_stages, num_microbatches):
    return [[op for op in ops if op[0] != "W"] + [("W", i) for i in range(num_microbatches)]
            for ops in ref.schedule_zb_h1(num_stages, num_microbatches)]
