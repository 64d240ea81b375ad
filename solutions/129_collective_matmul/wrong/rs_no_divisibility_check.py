"""Never checks that N divides the sequence length: c = S // N rows per chunk, and the last S mod N rows of
x are silently dropped (with S < N, every chunk is empty)."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_indivisible_sequence_raises_value_error"


class NoCheck(ref.CollectiveMatmul):
    def check_divisible(self, ring, x):
        pass


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, NoCheck())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, NoCheck())
