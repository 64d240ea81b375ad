"""Problem 119: ring attention.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 119``.

Part 1 is the forward pass, Part 2 the backward pass; each earns its own points.
The autograd Function below is a suggested shape, not a requirement: only
``ring_attention`` is tested.  Once its forward works, ``ring_attention`` can
return ``_RingAttention.apply(q, k, v, causal, group)``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

import harness  # noqa: F401  (harness.device(): where the tensors you make go)


class _RingAttention(torch.autograd.Function):
    """Ring attention as one autograd node: ``forward`` runs the ring, ``backward`` runs it again for the grads."""

    @staticmethod
    def forward(ctx, q, k, v, causal, group):
        """This rank's chunk of attention over the whole sequence (Part 1).

        Keep what backward needs with ``ctx.save_for_backward`` (q, k, v, the output and
        the log-sum-exp of every query row are enough).
        """
        raise NotImplementedError("ring_attention forward: see README.md, 'Part 1: forward'")

    @staticmethod
    def backward(ctx, dout):
        """Gradients for q, k and v of this rank's chunk, then None for causal and group (Part 2)."""
        raise NotImplementedError("ring_attention backward: see README.md, 'Part 2: backward'")


def ring_attention(q, k, v, causal=False, group=None):
    """Attention over a sequence split in contiguous chunks across the ranks of ``group``.

    ``q``, ``k``, ``v``: this rank's chunk, shaped [B, H, S/N, D]; every rank holds a chunk of
    the same shape, and group rank r holds sequence positions r*S/N .. (r+1)*S/N - 1.
    Returns this rank's rows of softmax(Q Kᵀ / √D [+ causal mask on GLOBAL positions]) V over the
    whole sequence, shaped like ``q``.  ``group=None`` means the default group.
    The chunks arrive on ``harness.device()``; make every tensor you create there too
    (``torch.zeros_like(q)``, ``device=q.device``): the running max and sum, a causal mask's positions.

    Communication: only ``dist.isend`` / ``dist.irecv`` of single K or V chunks (and, in
    backward, of their gradients), passed one way round the ring, the same way on every rank
    (e.g. sent to the next rank (r + 1) % N and received from the previous rank (r - 1) % N);
    N - 1 hops of K and of V in forward; no collectives.
    Differentiable for q, k and v (Part 2).
    """
    # Suggested: fill in _RingAttention above, then replace this line with
    #     return _RingAttention.apply(q, k, v, causal, group)
    raise NotImplementedError("ring_attention: see README.md, 'Part 1: forward'")
