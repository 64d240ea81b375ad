"""Passes every rank's whole partial product x @ w (all S rows) round the ring and sums them at each rank.

The values are right after N - 1 hops, but every message is N chunks, not one: N times the traffic of a
reduce-scatter, as if all-gathering the partial products.
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matmul_reduce_scatter_passes_partial_sums_round_the_ring"


class WholePartials(ref.CollectiveMatmul):
    def matmul_reduce_scatter(self, ring, x, w):
        self.check_divisible(ring, x)
        c = x.shape[0] // ring.size
        held = x @ w
        total = held
        for _ in range(ring.size - 1):
            arriving, works = ring.pass_on(held)
            ref.wait_all(works)
            total, held = total + arriving, arriving
        return ref.rows(total, ring.rank, c).clone()


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, WholePartials())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, WholePartials())
