"""Orders each kind chunk by chunk over all m micro-batches, not in groups of p: (2, 4, 2) differs from the example."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_statement_examples"


def interleaved_schedule(p, m, v):
    ref.interleaved_schedule(p, m, v)   # the same ValueError
    forwards = [("F", i, c) for c in range(v) for i in range(m)]
    backwards = [("B", i, c) for c in range(v - 1, -1, -1) for i in range(m)]
    return [ref._one_rank(forwards, backwards, ref._warmup(p, m, v, r)) for r in range(p)]
