"""Computes every block under the mask, fully masked ones too: right outputs, balanced, but about twice the work."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_no_fully_masked_block_is_computed"


class EveryBlock(ZigzagAttention):
    def needed(self, mask):
        return True


def zigzag_ring_attention(q, k, v, group=None):
    return EveryBlock()(q, k, v, group)
