"""Posts each K/V hop with isend/irecv and waits for it at once, before computing with the shard it holds.

Every message is non-blocking where it is posted, and the results are right, yet nothing overlaps: the rank
idles while the next shard travels, then computes.
"""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_forward_computes_while_the_next_shard_travels"


class WaitAtOnce(Ring):
    def hop(self, *tensors):
        arrived = super().hop(*tensors)()
        return lambda: arrived


class WaitsRightAfterPosting(ZigzagAttention):
    def forward(self, ring, *tensors):
        return super().forward(WaitAtOnce(ring.group), *tensors)


def zigzag_ring_attention(q, k, v, group=None):
    return WaitsRightAfterPosting()(q, k, v, group)
