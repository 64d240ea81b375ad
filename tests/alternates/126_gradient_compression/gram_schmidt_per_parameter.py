"""Gram-Schmidt instead of QR (a column whose norm is ~0 next to P's largest becomes zero, never 0 / 0), one
all-reduce per weight's P and per weight's Q instead of one per bucket, each weight's first Q drawn in float32
from a fresh generator seeded with the seed, and a bf16 hook that divides in float32 before it rounds to bf16 and
waits on its work object instead of chaining a callback (torch's own hooks are refused as stand-ins)."""
import torch
import torch.distributed as dist


class BF16State:
    def __init__(self, process_group=None):
        self.process_group = process_group


def bf16_compress_hook(state, bucket):
    buffer = bucket.buffer()
    on_the_wire = (buffer / dist.get_world_size(state.process_group)).to(torch.bfloat16)
    dist.all_reduce(on_the_wire, group=state.process_group)
    buffer.copy_(on_the_wire)
    done = torch.futures.Future()
    done.set_result(buffer)
    return done


class PowerSGDState:
    def __init__(self, process_group=None, matrix_approximation_rank=1, seed=0):
        if matrix_approximation_rank < 1:
            raise ValueError("matrix_approximation_rank must be at least 1")
        self.process_group, self.matrix_approximation_rank, self.seed = process_group, matrix_approximation_rank, seed
        self.error, self.q = {}, {}


def _gram_schmidt(P):
    P = P.clone()
    largest = float(torch.linalg.vector_norm(P, dim=0).max()) if P.numel() else 0.0
    for i in range(P.shape[1]):
        for j in range(i):
            P[:, i] -= (P[:, j] @ P[:, i]) * P[:, j]
        norm = float(torch.linalg.vector_norm(P[:, i]))
        if norm <= 1e-12 * largest or norm == 0.0:
            P[:, i] = 0.0        # no new direction: a zero column leaves P P^T a projection
        else:
            P[:, i] /= norm
    return P


def _summed(t, group):
    dist.all_reduce(t, group=group)
    return t


def _compress(state, p, grad, world):
    group = state.process_group
    M = grad.view(grad.shape[0], -1)
    if p not in state.error:
        n, m = M.shape
        gen = torch.Generator().manual_seed(state.seed)
        state.q[p] = torch.randn(m, min(n, m, state.matrix_approximation_rank), generator=gen).to(M)
        state.error[p] = torch.zeros_like(M)
    M_in = M + state.error[p]
    P = _gram_schmidt(_summed(M_in @ state.q[p], group))
    Q = _summed(M_in.T @ P, group) / world
    M.copy_(P @ Q.T)
    state.error[p], state.q[p] = M_in - M, Q


def powersgd_hook(state, bucket):
    world = dist.get_world_size(state.process_group)
    for p, grad in zip(bucket.parameters(), bucket.gradients()):
        if grad.dim() >= 2:
            _compress(state, p, grad, world)
        else:
            grad.copy_(_summed(grad.clone(), state.process_group) / world)
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
