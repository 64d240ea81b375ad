"""Orthonormalises Q before P = M Q instead of orthonormalising P: P Q^T = P P^T M is no projection."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_powersgd_is_a_rank_r_projection_with_error_feedback"


class PowerSGDState(ref.PowerSGDState):
    def _feed_back(self, p, M):
        compressed_input = super()._feed_back(p, M)
        self.q[p] = torch.linalg.qr(self.q[p]).Q
        return compressed_input

    @staticmethod
    def _orthonormal(P):
        return P
