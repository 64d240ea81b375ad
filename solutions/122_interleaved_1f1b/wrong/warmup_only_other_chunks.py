"""Warm-up (v - 1)*p forwards, only the other chunks' round, dropping 2(p - r - 1): it finishes, but later than 1F1B."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_never_slower_than_1f1b"


def interleaved_schedule(p, m, v):
    ref.interleaved_schedule(p, m, v)   # the same ValueError
    forwards, backwards = ref._megatron_order(p, m, v, "F"), ref._megatron_order(p, m, v, "B")
    warmups = [ref._warmup(p, m, v, r) if v == 1 else min((v - 1) * p, m * v) for r in range(p)]
    return [ref._one_rank(forwards, backwards, w) for w in warmups]
