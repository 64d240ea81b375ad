"""Problem 129: collective matmul (async tensor parallelism).

Read README.md in this folder first.  Replace each ``raise NotImplementedError`` with your implementation,
then run ``python judge.py 129``.

Part 1 is the forward of ``all_gather_matmul``, Part 2 the forward of ``matmul_reduce_scatter``, Part 3 the
backward of both; each earns its own points.  The two autograd Functions below are a suggested shape, not a
requirement: only ``all_gather_matmul`` and ``matmul_reduce_scatter`` are tested.  Once a forward works, its
function can return ``_AllGatherMatmul.apply(x, w, group)`` (or ``_MatmulReduceScatter.apply(x, w, group)``).

Communication: only point-to-point messages (``import torch.distributed as dist``): ``dist.isend`` /
``dist.irecv`` or ``dist.batch_isend_irecv``; the harness refuses ``all_gather``, ``reduce_scatter`` and
``all_reduce``.  ``dist.get_rank(group)``, ``dist.get_world_size(group)`` and ``dist.get_global_rank(group, i)``
place this rank in the ring.
"""
from __future__ import annotations

import torch


class _AllGatherMatmul(torch.autograd.Function):
    """All-gather + GEMM as one autograd node; its backward is a GEMM + reduce-scatter."""

    @staticmethod
    def forward(ctx, x, w, group):
        """(x gathered along dim 0 over ``group``) @ w, chunk by chunk round a ring (Part 1).

        Keep what backward needs with ``ctx.save_for_backward`` (the gathered x and w are enough).
        """
        raise NotImplementedError("all_gather_matmul forward: see README.md, 'Part 1'")

    @staticmethod
    def backward(ctx, dout):
        """Gradients for x and w, then None for group (Part 3)."""
        raise NotImplementedError("all_gather_matmul backward: see README.md, 'Part 3'")


class _MatmulReduceScatter(torch.autograd.Function):
    """GEMM + reduce-scatter as one autograd node; its backward is an all-gather + GEMM."""

    @staticmethod
    def forward(ctx, x, w, group):
        """This rank's chunk of the sum over ``group`` of x @ w, partial sums round a ring (Part 2)."""
        raise NotImplementedError("matmul_reduce_scatter forward: see README.md, 'Part 2'")

    @staticmethod
    def backward(ctx, dout):
        """Gradients for x and w, then None for group (Part 3)."""
        raise NotImplementedError("matmul_reduce_scatter backward: see README.md, 'Part 3'")


def all_gather_matmul(x, w, group=None):
    """``cat([x_0, ..., x_{N-1}], dim=0) @ w``: the whole sequence times this rank's weight.

    ``x``: this rank's chunk of the sequence, ``[c, ..., k]`` (dim 0 the sequence, the last dim the features);
    every rank of ``group`` holds a chunk of the same shape, group rank r rows r*c .. (r+1)*c - 1.
    ``w``: this rank's weight, ``[k, n]`` (say a column shard of a column-parallel linear layer).
    Returns ``[N*c, ..., n]``.  ``group=None`` means the default group.

    Communication: a ring of N - 1 hops; every message is one x chunk as it is (c x ... x k elements);
    messages go one way round the ring, the same way on every rank.  Post the next hop, run the matmul of
    the chunk you hold, and only then wait.  Differentiable for x and w (Part 3).
    """
    raise NotImplementedError("all_gather_matmul: see README.md, 'Part 1'")


def matmul_reduce_scatter(x, w, group=None):
    """Rows r*c .. (r+1)*c - 1 of ``sum over the ranks j of x_j @ w_j``, r this rank's group rank, c = S/N.

    ``x``: ``[S, ..., k]``, the whole sequence, this rank's share of the features (say the input of a
    row-parallel linear layer); ``w``: ``[k, n]``.  Returns ``[S/N, ..., n]``.  Raises ValueError naming S and
    N when N does not divide S, before any message.  ``group=None`` means the default group.

    Communication: a ring of N - 1 hops; every message is one partial sum of one output chunk
    (S/N x ... x n elements), one way round the ring, the same way on every rank.  Post the receive, run the
    matmul that the arriving partial sum will be added to, and only then wait.  Differentiable for x and w.
    """
    raise NotImplementedError("matmul_reduce_scatter: see README.md, 'Part 2'")
