"""Uses Megatron's warm-up min(2(p - r - 1) + (v - 1)p, m*v) for v = 1 too: 2(p - r - 1), not 118's p - r - 1."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_v1_is_118s_1f1b"


def interleaved_schedule(p, m, v):
    ref.interleaved_schedule(p, m, v)   # the same ValueError
    forwards, backwards = ref._megatron_order(p, m, v, "F"), ref._megatron_order(p, m, v, "B")
    return [ref._one_rank(forwards, backwards, min(2 * (p - r - 1) + (v - 1) * p, m * v)) for r in range(p)]
