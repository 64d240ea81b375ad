"""Divides by the running sum after every block, before all blocks are seen, then rescales as if it had not."""
import torch

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_forward_matches_full_attention"


class EarlyNormalize(ref.RingAttention):
    def merge(self, acc, m, l, s, v):
        m_new, alpha, p = self.rescaling(m, s)
        l_new = l * alpha + p.sum(-1, keepdim=True)
        return (acc * alpha + p @ v) / l_new, m_new, l_new

    def finish(self, acc, m, l):
        return acc, m + torch.log(l)


ring_attention = EarlyNormalize()
