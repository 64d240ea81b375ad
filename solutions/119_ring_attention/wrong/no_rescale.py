"""When the running max grows, rescales the running sum but not the running output."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_forward_matches_full_attention"


class NoRescale(ref.RingAttention):
    def merge(self, acc, m, l, s, v):
        m_new, alpha, p = self.rescaling(m, s)
        return acc + p @ v, m_new, l * alpha + p.sum(-1, keepdim=True)


ring_attention = NoRescale()
