"""Never checks that N divides H: a head count that does not split fails deep in a reshape with a RuntimeError,
not with the ValueError the contract promises."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_indivisible_heads_raise_value_error"


class Unchecked(ref.Ulysses):
    def check_heads(self, heads, n, what):
        pass


def ulysses_attention(q, k, v, causal=False, group=None):
    return Unchecked()(q, k, v, causal, group)


def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    return Unchecked()(q, k, v, causal, ulysses_group, ring_group, what="usp_attention")
