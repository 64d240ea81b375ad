"""Problem 128: Ulysses sequence parallelism, and USP.

Read README.md in this folder first.  Replace each ``raise NotImplementedError`` with your implementation,
then run ``python judge.py 128``.

Part 1 is ``ulysses_attention``, Part 2 ``usp_attention``; each earns its own points.  ``ring_attention``
below is given: 119's ring attention (forward and backward), for Part 2 to use as it is.  Only
``ulysses_attention`` and ``usp_attention`` are tested.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


# ---- given: 119's ring attention, for Part 2 (use it as it is) ---------------------------------------------

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

def ulysses_attention(q, k, v, causal=False, group=None):
    """Attention over a sequence split in contiguous shards across the N ranks of ``group``.

    ``q``, ``k``, ``v``: this rank's shard, [B, H, S/N, D]; group rank r holds sequence positions
    r*S/N .. (r+1)*S/N - 1.  Returns this rank's rows of softmax(Q Kᵀ / √D [+ causal mask]) V over the whole
    sequence, shaped like ``q``.  ``group=None`` means the default group.

    Raises ValueError naming H and N when N does not divide H, before communicating.  Otherwise: one
    ``all_to_all`` over ``group`` trades q, k, v together (this shard, every head) for a head group of the
    whole sequence, [B, H/N, S, D] each; attention runs on it
    (``torch.nn.functional.scaled_dot_product_attention``); one more ``all_to_all`` trades the output back.
    Differentiable for q, k and v: in backward, exactly the mirrors of those two all_to_all.
    """
    raise NotImplementedError("ulysses_attention: see README.md, 'The contract'")


# ---- Part 2: USP -------------------------------------------------------------------------------------------

def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    """Attention over a sequence sharded over a grid of U x R ranks: Ulysses inside ``ulysses_group``, then
    ``ring_attention`` over ``ring_group``.

    The rank at Ulysses rank j (of U) and ring rank i (of R) holds shard i*U + j of the sequence, [B, H, S/N, D]
    with N = U*R.  Returns this rank's rows of full attention, shaped like ``q``.  Raises ValueError naming H and
    U when U does not divide H, before communicating.  The all_to_alls run on ``ulysses_group`` only, the ring's
    messages go to ring neighbours only.  Differentiable for q, k and v.
    """
    raise NotImplementedError("usp_attention: see README.md, 'The contract'")
