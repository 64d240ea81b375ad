"""Posts the next K/V chunk with isend/irecv, but waits for it before computing the block it holds.

Every message is non-blocking in the statement that posts it, yet nothing overlaps: the rank idles while the
chunk travels, then computes.
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_forward_computes_while_the_next_chunk_travels"


class WaitFirst(ref.Ring):
    def pass_on(self, *tensors):
        received, works = super().pass_on(*tensors)
        ref.wait_all(works)
        return received, []


class WaitsBeforeCompute(ref.RingAttention):
    def ring(self, group):
        return WaitFirst(group)


ring_attention = WaitsBeforeCompute()
