"""Makes N hops instead of N - 1: the last one only brings every chunk back to its owner."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_forward_passes_kv_n_minus_1_times"


class ExtraHop(ref.RingAttention):
    def forward(self, ring, q, k, v, causal):
        out, lse = super().forward(ring, q, k, v, causal)
        if ring.size > 1:
            _, works = ring.pass_on(k, v)
            ref.wait_all(works)
        return out, lse


ring_attention = ExtraHop()
