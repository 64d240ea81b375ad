"""Passes K and V to the previous rank, but masks as if they came from it: Q meets the wrong K chunk."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_causal_mask_at_chunk_borders"


class Backwards(ref.Ring):
    def __init__(self, group=None):
        super().__init__(group)
        self.next, self.prev = self.prev, self.next


class WrongDirection(ref.RingAttention):
    def ring(self, group):
        return Backwards(group)


ring_attention = WrongDirection()
