"""Gathers the whole of x round the ring first, then runs one matmul: an all-gather followed by a GEMM.

The ring and the values are right, but no matmul runs while a chunk travels: each hop is waited on at
once, and the compute starts only when the last chunk is in.
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_all_gather_matmul_computes_while_the_next_chunk_travels"


class GatherThenMultiply(ref.CollectiveMatmul):
    def all_gather_matmul(self, ring, x, w):
        c, held = x.shape[0], x.contiguous()
        gathered = x.new_empty((ring.size * c, *x.shape[1:]))
        for step in range(ring.size):
            ref.rows(gathered, ring.source(step), c)[...] = held
            if step < ring.size - 1:
                arriving, works = ring.pass_on(held)
                ref.wait_all(works)
                held = arriving
        return gathered @ w, gathered


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, GatherThenMultiply())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, GatherThenMultiply())
