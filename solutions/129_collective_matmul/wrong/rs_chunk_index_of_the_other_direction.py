"""Sends the partial sums to the next rank but picks the chunks as if they went to the previous one.

At step i it multiplies chunk (r + i + 1) mod N, while the partial sum arriving from rank r - 1 belongs to
chunk (r - i - 1) mod N: sums of different chunks get added.  On 2 ranks the two agree.
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matmul_reduce_scatter_matches_the_unsharded_matmul"


class OtherDirection(ref.CollectiveMatmul):
    def matmul_reduce_scatter(self, ring, x, w):
        self.check_divisible(ring, x)
        c = x.shape[0] // ring.size
        arriving, works = None, []
        for step in range(ring.size):
            partial = ref.rows(x, (ring.rank + step + 1) % ring.size, c) @ w
            ref.wait_all(works)
            if arriving is not None:
                partial = partial + arriving
            if step < ring.size - 1:
                arriving, works = ring.pass_on(partial)
        return partial


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, OtherDirection())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, OtherDirection())
