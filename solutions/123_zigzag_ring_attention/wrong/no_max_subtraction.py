"""Exponentiates the raw scores with no running max: exp(300) overflows float32."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_forward_large_logits_float32"


class NoMax(ZigzagAttention):
    def fold(self, state, s, v):
        acc, m, l = state
        p = torch.exp(s)
        return acc + p @ v, torch.zeros_like(m), l + p.sum(-1, keepdim=True)


def zigzag_ring_attention(q, k, v, group=None):
    return NoMax()(q, k, v, group)
