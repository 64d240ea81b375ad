"""Orthonormalises P by Gram-Schmidt, dividing each column by its norm with no guard: a zero gradient (or a
rank-deficient one) gives a zero column, 0 / 0 is NaN, and the error feedback carries the NaN into every step."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_powersgd_zero_and_rank_deficient_gradients"


class PowerSGDState(ref.PowerSGDState):
    @staticmethod
    def _orthonormal(P):
        P = P.clone()
        for i in range(P.shape[1]):
            P[:, i] -= P[:, :i] @ (P[:, :i].T @ P[:, i])
            P[:, i] /= torch.linalg.vector_norm(P[:, i])
        return P
