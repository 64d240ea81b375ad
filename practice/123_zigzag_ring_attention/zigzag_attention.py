"""Problem 123: zigzag ring attention (load-balanced causal ring attention).

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 123``.

Part 1 is the layout, Part 2 the forward pass, Part 3 the backward pass, Part 4 the
measured balance of work; each earns its own points.  The autograd Function below is
a suggested shape, not a requirement: only ``zigzag_shard`` and ``zigzag_ring_attention``
are tested.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

import harness  # noqa: F401  (harness.device(): where the tensors you make go)


def zigzag_shard(x, rank, world):
    """Rank ``rank``'s zigzag shard of ``x``, shaped [B, H, S, D] (the sequence is dim 2).

    Cut the sequence into 2N equal chunks (N = ``world``) and return chunk ``rank`` followed by
    chunk ``2N - 1 - rank``, concatenated along dim 2: shape [B, H, S/N, D], a new tensor.
    Raises ValueError when 2N does not divide S, or when rank is not one of 0 .. N-1.
    """
    raise NotImplementedError("zigzag_shard: see README.md, 'Part 1: the layout'")


class _ZigzagAttention(torch.autograd.Function):
    """Zigzag ring attention as one autograd node: ``forward`` runs the ring, ``backward`` runs it again."""

    @staticmethod
    def forward(ctx, q, k, v, group):
        """This rank's rows of causal attention over the whole sequence (Part 2).

        Keep what backward needs with ``ctx.save_for_backward`` (q, k, v, the output and the
        log-sum-exp of every query row are enough); never the other ranks' K or V.
        """
        raise NotImplementedError("zigzag_ring_attention forward: see README.md, 'Part 2: forward'")

    @staticmethod
    def backward(ctx, dout):
        """Gradients for q, k and v of this rank's shard, then None for group (Part 3)."""
        raise NotImplementedError("zigzag_ring_attention backward: see README.md, 'Part 3: backward'")


def zigzag_ring_attention(q, k, v, group=None):
    """Causal attention over a sequence laid out in zigzag shards across the ranks of ``group``.

    ``q``, ``k``, ``v``: this rank's zigzag shard (``zigzag_shard(x, r, N)`` of the whole sequence),
    each [B, H, S/N, D]; group rank r holds the positions of chunks r and 2N-1-r.  Returns this
    rank's rows of softmax(Q Kᵀ / √D + causal mask on GLOBAL positions) V, in the same zigzag
    order, shaped and typed like ``q``; differentiable for q, k and v.  ``group=None``: the
    default group.  Make every tensor you create on ``harness.device()`` (like ``q``).

    Communication: only ``dist.isend`` / ``dist.irecv`` of single K or V shards (in backward also
    their gradients) with ring neighbours, one way round the ring; N - 1 hops of K and of V in
    forward.  Skip the blocks the causal mask hides entirely: every rank computes 2N + 1 blocks.
    """
    # Suggested: fill in _ZigzagAttention above, then
    #     return _ZigzagAttention.apply(q, k, v, group)
    raise NotImplementedError("zigzag_ring_attention: see README.md, 'Part 2: forward'")
