"""Never checks that m is a multiple of p: returns a schedule with micro-batches that do not exist, no ValueError."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_m_not_multiple_of_p_raises"


def interleaved_schedule(p, m, v):
    forwards, backwards = ref._megatron_order(p, m, v, "F"), ref._megatron_order(p, m, v, "B")
    return [ref._one_rank(forwards, backwards, ref._warmup(p, m, v, r)) for r in range(p)]
