"""Files each arriving x chunk under the wrong owner: after ``step`` hops it takes the chunk for rank r + step.

Chunks move to the NEXT rank each hop, so the one held after ``step`` hops came from rank (r - step) mod N.
On 2 ranks both formulas agree; from 3 ranks on, rows of the output land in the wrong place.
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_all_gather_matmul_matches_the_unsharded_matmul"


class ArrivalOrderRing(ref.Ring):
    def source(self, step):
        return (self.rank + step) % self.size


class ArrivalOrder(ref.CollectiveMatmul):
    def ring(self, group):
        return ArrivalOrderRing(group)

    def matmul_reduce_scatter(self, ring, x, w):
        return super().matmul_reduce_scatter(ref.Ring(ring.group), x, w)   # (only the gather is wrong)


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, ArrivalOrder())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, ArrivalOrder())
