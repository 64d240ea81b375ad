"""schedule_zb_h1 lists the stages last-first: stage 0 gets the last stage's op list (warm-up and deferral reversed)."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_statement_examples"


def schedule_zb_h1(num_stages, num_microbatches):
    return ref.schedule_zb_h1(num_stages, num_microbatches)[::-1]
