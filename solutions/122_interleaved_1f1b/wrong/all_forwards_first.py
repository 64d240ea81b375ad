"""Every rank runs all m*v forwards before any backward (GPipe's order): right results, every activation held."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_peak_activations_within_bound"


def interleaved_schedule(p, m, v):
    ref.interleaved_schedule(p, m, v)
    forwards, backwards = ref._megatron_order(p, m, v, "F"), ref._megatron_order(p, m, v, "B")
    return [ref._one_rank(forwards, backwards, m * v) for _ in range(p)]
