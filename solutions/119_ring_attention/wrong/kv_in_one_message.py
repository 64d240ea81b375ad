"""Stacks K and V into one message per hop instead of sending two chunk-shaped messages."""
import torch

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_forward_passes_kv_chunks_one_way_round_the_ring"


class Stacked(ref.Ring):
    def pass_on(self, *tensors):
        (both,), works = super().pass_on(torch.stack(tensors))
        return list(both.unbind(0)), works


class OneMessage(ref.RingAttention):
    def ring(self, group):
        return Stacked(group)


ring_attention = OneMessage()
