"""Multiplies all of x first, then reduce-scatters the product round the ring: a GEMM followed by a ring
reduce-scatter.

The ring, the messages and the values are right, but while a partial sum travels the rank only waits (the
additions are no matmul): nothing the output needs is computed in flight.
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matmul_reduce_scatter_computes_while_the_partial_sum_travels"


class MatmulFirst(ref.CollectiveMatmul):
    def matmul_reduce_scatter(self, ring, x, w):
        self.check_divisible(ring, x)
        c, product = x.shape[0] // ring.size, x @ w
        arriving, works = None, []
        for step in range(ring.size):
            partial = ref.rows(product, ring.source(step + 1), c)
            ref.wait_all(works)
            if arriving is not None:
                partial = partial + arriving
            if step < ring.size - 1:
                arriving, works = ring.pass_on(partial.contiguous())
        return partial


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, MatmulFirst())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, MatmulFirst())
