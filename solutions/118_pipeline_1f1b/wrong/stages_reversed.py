"""schedule_1f1b lists the stages last-first: stage 0 gets the last stage's op list (warm-up counts reversed)."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_schedule_examples"


def schedule_1f1b(num_stages, num_microbatches):
    return ref.schedule_1f1b(num_stages, num_microbatches)[::-1]
