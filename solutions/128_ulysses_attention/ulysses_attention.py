"""Problem 128 reference: Ulysses sequence parallelism, and USP (a grid of Ulysses groups x ring groups).

Every rank holds one contiguous shard of the sequence, [B, H, S/N, D] for q, k and v.  Ulysses trades that
shard, with ONE all_to_all, for a head group of the whole sequence, [B, H/N, S, D]: then plain attention
runs on it, since every head's attention is independent of the others.  A second all_to_all trades the
output back.  USP does the same inside a Ulysses group of U ranks, which turns U neighbouring shards into
one contiguous block of the sequence, and runs 119's ring attention over the blocks of its ring group.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


# ---- given: 119's ring attention, for USP ----------------------------------------------------------------

def _ring_seats(group):
    """This rank's place in the ring of ``group``: (ring rank, ring size, next rank, previous rank), global."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    seat = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    return rank, size, seat((rank + 1) % size), seat((rank - 1) % size)


def _pass_on(tensors, nxt, prev, group):
    """isend each tensor to the next rank, irecv one like it from the previous: (the arriving buffers, works)."""
    arriving = [torch.empty_like(t) for t in tensors]
    works = [dist.isend(t, nxt, group=group) for t in tensors]
    works += [dist.irecv(a, prev, group=group) for a in arriving]
    return arriving, works


def _wait(works):
    for work in works:
        work.wait()


def _block_scores(q, k, q_chunk, k_chunk, causal):
    """Q K^T / sqrt(D) of one block, masked on GLOBAL positions; None when the block is wholly masked."""
    if causal and k_chunk > q_chunk:
        return None
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal and k_chunk == q_chunk:
        c = q.shape[-2]
        s = s.masked_fill(torch.ones(c, c, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s


class _RingAttention(torch.autograd.Function):
    """119's ring: K/V chunks go one hop per step to the next rank; an online softmax folds each block in."""

    @staticmethod
    def forward(ctx, q, k, v, causal, group):
        rank, size, nxt, prev = _ring_seats(group)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        mine = (q, k, v)
        acc, l = torch.zeros_like(q), q.new_zeros(q.shape[:-1] + (1,))
        m = q.new_full(q.shape[:-1] + (1,), float("-inf"))
        for step in range(size):
            if step < size - 1:                                   # the next chunk travels while this one counts
                (k_next, v_next), works = _pass_on((k, v), nxt, prev, group)
            s = _block_scores(q, k, rank, (rank - step) % size, causal)
            if s is not None:
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
                acc, l, m = acc * alpha + p @ v, l * alpha + p.sum(-1, keepdim=True), m_new
            if step < size - 1:
                _wait(works)
                k, v = k_next, v_next
        out, lse = acc / l, m + torch.log(l)
        ctx.save_for_backward(*mine, out, lse)
        ctx.causal, ctx.group = causal, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        rank, size, nxt, prev = _ring_seats(ctx.group)
        dout = dout.contiguous()
        delta = (dout * out).sum(-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for step in range(size):
            if step < size - 1:
                (k_next, v_next), works = _pass_on((k, v), nxt, prev, ctx.group)
            s = _block_scores(q, k, rank, (rank - step) % size, ctx.causal)
            if s is not None:
                p = torch.exp(s - lse)
                ds = p * (dout @ v.transpose(-1, -2) - delta) / math.sqrt(q.shape[-1])
                dq, dk, dv = dq + ds @ k, dk + ds.transpose(-1, -2) @ q, dv + p.transpose(-1, -2) @ dout
            if size > 1:                    # dK, dV travel with their chunk; the last hop takes them home
                (dk, dv), grad_works = _pass_on((dk, dv), nxt, prev, ctx.group)
                _wait(grad_works)
            if step < size - 1:
                _wait(works)
                k, v = k_next, v_next
        return dq, dk, dv, None, None


def ring_attention(q, k, v, causal=False, group=None):
    """119's ring attention over the ranks of ``group``; ring rank i holds chunk i of the sequence."""
    return _RingAttention.apply(q, k, v, causal, group)


# ---- Part 1: Ulysses ---------------------------------------------------------------------------------------

class _Exchange(torch.autograd.Function):
    """One all_to_all as an autograd node: forward runs ``there``, backward runs ``back`` on the gradient, so
    the gradient goes back the way the data came (c10d collectives are not differentiable by themselves)."""

    @staticmethod
    def forward(ctx, x, group, there, back):
        ctx.group, ctx.back = group, back
        return there(x, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.back(grad.contiguous(), ctx.group), None, None, None


class Ulysses:
    """The algorithm, one overridable piece per method."""

    def size(self, group) -> int:
        return dist.get_world_size(group)

    def check_heads(self, heads: int, n: int, what: str):
        """Raise before any communication: a head group per rank needs N to divide H."""
        if heads % n:
            raise ValueError(f"{what}: {heads} heads cannot be split among {n} ranks (H % N = {heads % n})")

    def to_heads(self, x, group):
        """[..., H, S/N, D] (my shard, every head) -> [..., H/N, S, D] (my head group, the whole sequence).

        Send head group j to rank j; from rank i comes chunk i of the sequence for my heads, and rank order is
        sequence order, so the received chunks are concatenated in the order they came."""
        n = self.size(group)
        *lead, h, c, d = x.shape
        send = x.reshape(*lead, n, h // n, c, d).movedim(-4, 0).contiguous()      # [N, ..., H/N, c, D]
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=group)                       # received[i]: rank i's chunk
        return received.movedim(0, -3).reshape(*lead, h // n, n * c, d)

    def to_seq(self, x, group):
        """[..., H/N, S, D] -> [..., H, S/N, D]: the mirror of ``to_heads``."""
        n = self.size(group)
        *lead, hn, s, d = x.shape
        send = x.reshape(*lead, hn, n, s // n, d).movedim(-3, 0).contiguous()     # [N, ..., H/N, c, D]
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=group)                       # received[i]: rank i's heads
        return received.movedim(0, -4).reshape(*lead, n * hn, s // n, d)

    def attend(self, q, k, v, causal, ring_group):
        """Attention of a head group: over the whole sequence (Ulysses), or round the ring of blocks (USP)."""
        if ring_group is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return ring_attention(q, k, v, causal, ring_group)

    def __call__(self, q, k, v, causal, group, ring_group=None, what="ulysses_attention"):
        self.check_heads(q.shape[1], self.size(group), what)
        qkv = _Exchange.apply(torch.stack([q, k, v]), group, self.to_heads, self.to_seq)   # one all_to_all
        out = self.attend(*qkv.unbind(0), causal, ring_group)
        return _Exchange.apply(out, group, self.to_seq, self.to_heads)                      # and one back


def ulysses_attention(q, k, v, causal=False, group=None):
    """Attention over the whole sequence; this rank holds shard r of it, [B, H, S/N, D]."""
    return Ulysses()(q, k, v, causal, group)


# ---- Part 2: USP -------------------------------------------------------------------------------------------

def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    """Ulysses inside ``ulysses_group`` (U ranks), then ring attention over ``ring_group`` (R ranks).

    After the all_to_all this rank holds block i (its ring rank) of the sequence, U shards long, for H/U
    heads: the ring over the R blocks is 119's, with chunks U times longer."""
    return Ulysses()(q, k, v, causal, ulysses_group, ring_group, what="usp_attention")
