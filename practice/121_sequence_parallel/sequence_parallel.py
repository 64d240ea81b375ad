"""Problem 121: Megatron sequence parallelism around a tensor-parallel MLP block.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 121``.

Every function and layer takes ``group=None``: the tensor-parallel process group
(None: all ranks).  t = dist.get_world_size(group), r = dist.get_rank(group).
Activations are laid out [s, b, h] (sequence first); rank r holds rows
[r*s/t, (r+1)*s/t) of the sequence; s is divisible by t.

The full layers and the inputs arrive on ``harness.device()`` (the rank's GPU under NCCL,
the CPU under gloo); every tensor you create goes there too (``x.new_empty``,
``torch.empty_like``, ``device=x.device``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def all_gather_sequence(x, group=None):
    """Forward: [s/t, ...] on each rank -> [s, ...]: every rank's x concatenated along dim 0, in rank order.

    Backward: a reduce-scatter along dim 0 (sum the gradients of every rank, keep this rank's
    s/t rows).  Exactly one all_gather forward and one reduce_scatter backward.  Write it as a
    ``torch.autograd.Function``.
    """
    raise NotImplementedError("all_gather_sequence: see README.md, 'The two communication functions'")


def reduce_scatter_sequence(x, group=None):
    """Forward: [s, ...] on each rank -> [s/t, ...]: this rank's rows [r*s/t, (r+1)*s/t) of the sum over ranks.

    Backward: an all-gather along dim 0.  Exactly one reduce_scatter forward and one all_gather
    backward.  Raises ValueError naming s and t when t does not divide s.  Do not modify x in place.
    """
    raise NotImplementedError("reduce_scatter_sequence: see README.md, 'The two communication functions'")


class SequenceParallelMLP(nn.Module):
    """``x + fc2(gelu(fc1(ln(x))))`` with the sequence split across the tensor-parallel ranks.

    ``SequenceParallelMLP(ln, fc1, fc2, group=None)`` from the full single-device layers:
      * ``ln`` (nn.LayerNorm over h) is replicated: a copy of it on every rank;
      * ``fc1`` (Linear(h, f)) split by columns: rank r keeps rows [r*f/t, (r+1)*f/t) of its weight
        and those entries of its bias;
      * ``fc2`` (Linear(f, h)) split by rows: rank r keeps columns [r*f/t, (r+1)*f/t) of its weight;
        its bias is replicated, added once, after the reduce-scatter;
      * every kept tensor is an ``nn.Parameter`` of this module, a copy (clone) of the full layer's entries;
      * raises ValueError naming f and t when t does not divide f.
    ``forward(x_shard)``: x_shard is this rank's rows [s/t, b, h] of x; returns this rank's rows
    [s/t, b, h] of the block's output.  The LayerNorm runs on those s/t rows only.
    """

    def __init__(self, ln: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear, group=None):
        super().__init__()
        raise NotImplementedError("SequenceParallelMLP.__init__: see README.md, 'SequenceParallelMLP'")

    def forward(self, x_shard):
        raise NotImplementedError("SequenceParallelMLP.forward: see README.md, 'SequenceParallelMLP'")

    def finish_grad_sync(self):
        """Called once after backward: make the gradients of the replicated parameters (ln's weight and
        bias, fc2's bias) the full block's on every rank of the group, with all_reduce only.  Leave the
        gradients of the fc1 and fc2 weight shards as they are: they are complete already."""
        raise NotImplementedError("SequenceParallelMLP.finish_grad_sync: see README.md, 'finish_grad_sync'")
