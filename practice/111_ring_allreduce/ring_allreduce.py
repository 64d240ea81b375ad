"""Problem 111: Ring all-reduce from point-to-point.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 111``.

Only ``dist.send``/``dist.recv``/``dist.isend``/``dist.irecv``/``dist.batch_isend_irecv``
are allowed here: every collective (``dist.all_reduce`` included) is refused by the harness.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """SUM ``tensor`` over every rank of ``group`` (default: all ranks), in place; return ``tensor``.

    Any shape (0-d included), any numel >= 0 (also fewer elements than ranks),
    dtypes float32, float64, bfloat16 and int64.  Works as a ring: first a
    reduce-scatter phase, then an all-gather phase, each of N-1 steps in which
    rank r sends one chunk of ``tensor.flatten().tensor_split(N)`` to rank (r+1)%N
    and receives one from rank (r-1)%N.  Every rank ends with bitwise the same result.
    """
    raise NotImplementedError("ring_all_reduce: see README.md, 'ring_all_reduce'")


def ring_reduce_scatter(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Return, as a new tensor, chunk r (this rank's index in ``group``) of the SUM over ranks of
    ``tensor.flatten().tensor_split(N)``.  ``tensor`` itself is left unchanged.
    """
    raise NotImplementedError("ring_reduce_scatter: see README.md, 'ring_reduce_scatter'")


def ring_all_gather(chunk: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank passes a chunk of the same shape (at least one dimension) and dtype.

    Returns ``torch.cat`` of all ranks' chunks along dim 0, in rank order, on every rank.
    """
    raise NotImplementedError("ring_all_gather: see README.md, 'ring_all_gather'")
