"""Problem 119 reference: ring attention, forward and backward.

One rank holds one contiguous chunk of the sequence.  Its query chunk stays put;
the key/value chunks move one hop round the ring per step while this rank folds
the chunk it holds into an online softmax (running max ``m``, running sum ``l``).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

import harness


class Ring:
    """This rank's place in the ring of ``group``: its chunk index and its two neighbours."""

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.next = self.global_rank((self.rank + 1) % self.size)
        self.prev = self.global_rank((self.rank - 1) % self.size)

    def global_rank(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def source(self, step: int) -> int:
        """Whose chunk this rank holds after ``step`` hops: chunks move to the next rank each hop."""
        return (self.rank - step) % self.size

    def pass_on(self, *tensors):
        """Post one isend per tensor to the next rank and one irecv per tensor from the previous one."""
        received = [torch.empty_like(t) for t in tensors]
        works = [dist.isend(t, self.next, group=self.group) for t in tensors]
        works += [dist.irecv(r, self.prev, group=self.group) for r in received]
        return received, works


def wait_all(works):
    for work in works:
        work.wait()


class RingAttention:
    """The algorithm, one overridable piece per method."""

    def __call__(self, q, k, v, causal=False, group=None):
        return _RingAttentionFunction.apply(q, k, v, causal, group, self)

    def ring(self, group) -> Ring:
        return Ring(group)

    def mask(self, q_chunk: int, k_chunk: int, length: int, causal: bool):
        """Which (query, key) pairs of this block may attend, on GLOBAL positions; None: all of them."""
        if not causal:
            return None
        positions = torch.arange(length, device=harness.device())
        q_pos, k_pos = q_chunk * length + positions, k_chunk * length + positions
        return q_pos[:, None] >= k_pos[None, :]

    def scores(self, q, k, mask):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return s if mask is None else s.masked_fill(~mask, float("-inf"))

    def rescaling(self, m, s):
        """The new running max, the factor that moves old sums onto it, and this block's exp(s - new max)."""
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        return m_new, torch.exp(m - m_new), torch.exp(s - m_new)

    def merge(self, acc, m, l, s, v):
        """Fold one block of scores ``s`` and its values into the running (acc, m, l)."""
        m_new, alpha, p = self.rescaling(m, s)
        return acc * alpha + p @ v, m_new, l * alpha + p.sum(-1, keepdim=True)

    def finish(self, acc, m, l):
        """The output and the log-sum-exp of every query row, once every block is in."""
        return acc / l, m + torch.log(l)

    def forward(self, ring: Ring, q, k, v, causal):
        acc = torch.zeros_like(q)
        m = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)
        for step in range(ring.size):
            last = step == ring.size - 1
            if not last:   # the next chunk travels while this one is computed
                (k_next, v_next), works = ring.pass_on(k, v)
            mask = self.mask(ring.rank, ring.source(step), q.shape[-2], causal)
            if mask is None or bool(mask.any()):
                acc, m, l = self.merge(acc, m, l, self.scores(q, k, mask), v)
            if not last:
                wait_all(works)
                k, v = k_next, v_next
        return self.finish(acc, m, l)

    def backward(self, ring: Ring, q, k, v, out, lse, dout, causal):
        """dK and dV accumulators travel with their K/V chunk; one last hop takes them home."""
        delta = (dout * out).sum(-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for step in range(ring.size):
            last = step == ring.size - 1
            if not last:
                (k_next, v_next), works = ring.pass_on(k, v)
            mask = self.mask(ring.rank, ring.source(step), q.shape[-2], causal)
            if mask is None or bool(mask.any()):
                p = torch.exp(self.scores(q, k, mask) - lse)
                ds = p * (dout @ v.transpose(-1, -2) - delta) / math.sqrt(q.shape[-1])
                dv = dv + p.transpose(-1, -2) @ dout
                dq = dq + ds @ k
                dk = dk + ds.transpose(-1, -2) @ q
            if ring.size > 1:
                dk, dv = self.pass_grads(ring, dk, dv)
            if not last:
                wait_all(works)
                k, v = k_next, v_next
        return dq, dk, dv

    def pass_grads(self, ring: Ring, dk, dv):
        """Send the accumulators on with the chunk they belong to; the last hop takes them home."""
        (dk, dv), works = ring.pass_on(dk, dv)
        wait_all(works)
        return dk, dv


class _RingAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, group, algorithm):
        ring = algorithm.ring(group)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = algorithm.forward(ring, q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.algorithm = ring, causal, algorithm
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.algorithm.backward(ctx.ring, q, k, v, out, lse, dout.contiguous(), ctx.causal)
        return dq, dk, dv, None, None, None


def ring_attention(q, k, v, causal=False, group=None):
    return RingAttention()(q, k, v, causal, group)
