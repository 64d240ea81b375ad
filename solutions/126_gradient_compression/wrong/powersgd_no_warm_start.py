"""Draws a new random Q at every step instead of reusing the previous step's averaged Q: each step is a fresh
power iteration, still a rank-r projection, but it never refines the subspace it found."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_powersgd_q_is_warm_started"


class PowerSGDState(ref.PowerSGDState):
    def _feed_back(self, p, M):
        compressed_input = super()._feed_back(p, M)
        self.q[p] = torch.randn(self.q[p].shape, generator=self.generator, dtype=M.dtype, device="cpu").to(M.device)
        return compressed_input
