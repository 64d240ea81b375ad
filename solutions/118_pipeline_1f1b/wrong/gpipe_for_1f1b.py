"""schedule_1f1b returns the GPipe order: correct results, but every stage holds all m activations."""
from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_1f1b_is_the_canonical_order"


def schedule_1f1b(num_stages, num_microbatches):
    return schedule_gpipe(num_stages, num_microbatches)
