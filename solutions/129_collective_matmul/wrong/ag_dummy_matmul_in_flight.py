"""Runs a throwaway matmul while each chunk travels, and the real one only after the wait.

Something is computed between posting and waiting, but the output does not come from it: the harness
counts only the compute whose result reaches the output, so this overlaps nothing that matters.
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_all_gather_matmul_computes_while_the_next_chunk_travels"


class DummyInFlight(ref.CollectiveMatmul):
    def all_gather_matmul(self, ring, x, w):
        c, held = x.shape[0], x.contiguous()
        out = x.new_empty((ring.size * c, *x.shape[1:-1], w.shape[-1]))
        gathered = x.new_empty((ring.size * c, *x.shape[1:]))
        for step in range(ring.size):
            j = ring.source(step)
            if step < ring.size - 1:
                arriving, works = ring.pass_on(held)
                _ = held @ w                        # "overlap"
                ref.wait_all(works)
            ref.rows(out, j, c)[...] = held @ w
            ref.rows(gathered, j, c)[...] = held
            if step < ring.size - 1:
                held = arriving
        return out, gathered


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, DummyInFlight())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, DummyInFlight())
