"""Warm-up 2(p - r - 1) + (v - 1)p without the min(..., m*v): past m*v the cool-down slice drops backwards."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_every_op_once_forward_before_backward"


def interleaved_schedule(p, m, v):
    ref.interleaved_schedule(p, m, v)   # the same ValueError
    forwards, backwards = ref._megatron_order(p, m, v, "F"), ref._megatron_order(p, m, v, "B")
    warmups = [ref._warmup(p, m, v, r) if v == 1 else 2 * (p - r - 1) + (v - 1) * p for r in range(p)]
    return [ref._one_rank(forwards, backwards, w) for w in warmups]
