"""Warms up with (p - r - 1) + (v - 1)*p forwards: 118's count plus a round of chunks, without Megatron's factor 2."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_canonical_order"


def interleaved_schedule(p, m, v):
    ref.interleaved_schedule(p, m, v)   # the same ValueError
    forwards, backwards = ref._megatron_order(p, m, v, "F"), ref._megatron_order(p, m, v, "B")
    return [ref._one_rank(forwards, backwards, min(p - r - 1 + (v - 1) * p, m * v)) for r in range(p)]
