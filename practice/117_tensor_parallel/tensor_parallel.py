"""Problem 117: Megatron tensor parallel, column- and row-parallel layers (张量并行：列切分与行切分).

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 117``.

Every function and layer takes ``group=None``: the tensor-parallel process group
(None: all ranks).  N = dist.get_world_size(group), r = dist.get_rank(group).

The full layers and the inputs arrive on ``harness.device()`` (the rank's GPU under NCCL,
the CPU under gloo); every tensor you create goes there too, index tensors included
(``device=full.weight.device``, ``torch.empty_like``).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def copy_to_tp(x, group=None):
    """Megatron's f: identity in forward; in backward, all_reduce (sum) the gradient over ``group``.

    Put it where a replicated tensor enters the parallel region.  Forward issues no
    communication; backward issues exactly one all_reduce.  Write it as a
    ``torch.autograd.Function``.
    """
    raise NotImplementedError("copy_to_tp: see README.md, 'The three communication functions'")


def reduce_from_tp(x, group=None):
    """Megatron's g: all_reduce (sum) over ``group`` in forward; identity in backward.

    Put it where partial sums leave the parallel region.  Forward issues exactly one
    all_reduce; backward issues none.  Do not modify ``x`` in place.
    """
    raise NotImplementedError("reduce_from_tp: see README.md, 'The three communication functions'")


def gather_from_tp(x, group=None):
    """Forward: all_gather every rank's ``x`` and concatenate along the LAST dim, in rank order.

    Backward: keep this rank's own slice of the gradient (no communication).
    Every rank's ``x`` has the same shape [..., k]; the result is [..., N*k].
    """
    raise NotImplementedError("gather_from_tp: see README.md, 'The three communication functions'")


class ColumnParallelLinear(nn.Module):
    """The output features split across ranks: rank r keeps rows [r*out/N, (r+1)*out/N) of ``full``.

    ``ColumnParallelLinear(full, gather_output=False, group=None)``:
      * ``full`` is an nn.Linear with weight [out, in] (same on every rank); keep only
        your rows of its weight and bias, as parameters of their own (clone them);
      * ``forward(x)``: x is the full input [..., in], the same on every rank; returns
        your slice [..., out/N] of the output, or, with ``gather_output=True``, the
        full output [..., out] on every rank;
      * raises ValueError naming ``out`` and N when N does not divide out.
    """

    def __init__(self, full: nn.Linear, gather_output: bool = False, group=None):
        super().__init__()
        raise NotImplementedError("ColumnParallelLinear.__init__: see README.md, 'ColumnParallelLinear'")

    def forward(self, x):
        raise NotImplementedError("ColumnParallelLinear.forward: see README.md, 'ColumnParallelLinear'")


class RowParallelLinear(nn.Module):
    """The input features split across ranks: rank r keeps columns [r*in/N, (r+1)*in/N) of ``full``.

    ``RowParallelLinear(full, input_is_parallel=True, group=None)``:
      * keeps its columns of ``full.weight`` and the WHOLE bias, added once after the reduction;
      * ``forward(x)``: with ``input_is_parallel=True`` x is your slice [..., in/N] of the
        input; with False, x is the full input [..., in] and you take your slice yourself
        (the input's gradient must still come out full on every rank);
      * returns the full output [..., out], the same on every rank;
      * raises ValueError naming ``in`` and N when N does not divide in.
    """

    def __init__(self, full: nn.Linear, input_is_parallel: bool = True, group=None):
        super().__init__()
        raise NotImplementedError("RowParallelLinear.__init__: see README.md, 'RowParallelLinear'")

    def forward(self, x):
        raise NotImplementedError("RowParallelLinear.forward: see README.md, 'RowParallelLinear'")


class ParallelMLP(nn.Module):
    """Megatron's MLP: column-parallel fc1, GELU, row-parallel fc2; one all_reduce each way.

    ``ParallelMLP(fc1, fc2, group=None)``; ``forward(x)`` takes and returns full tensors,
    equal to ``fc2(F.gelu(fc1(x)))``.  Raises ValueError when N does not divide fc1.out_features.
    """

    def __init__(self, fc1: nn.Linear, fc2: nn.Linear, group=None):
        super().__init__()
        raise NotImplementedError("ParallelMLP.__init__: see README.md, 'ParallelMLP'")

    def forward(self, x):
        raise NotImplementedError("ParallelMLP.forward: see README.md, 'ParallelMLP'")


class ParallelSelfAttention(nn.Module):
    """Multi-head self-attention with the heads split across ranks; one all_reduce each way.

    ``ParallelSelfAttention(qkv, proj, num_heads, group=None)``:
      * ``qkv.weight`` is [3*H*D, E], laid out as [q; k; v], each head-major (head h of q
        is rows h*D:(h+1)*D; of k, H*D + h*D: ...; of v, 2*H*D + h*D: ...);
      * rank r keeps heads [r*H/N, (r+1)*H/N) of EACH of q, k and v, and proj row-parallel;
      * ``forward(x)``: x [..., S, E] full; returns proj(softmax(Q K^T / sqrt(D)) V), no mask,
        full [..., S, E] on every rank;
      * raises ValueError naming num_heads and N when N does not divide num_heads.
    """

    def __init__(self, qkv: nn.Linear, proj: nn.Linear, num_heads: int, group=None):
        super().__init__()
        raise NotImplementedError("ParallelSelfAttention.__init__: see README.md, 'ParallelSelfAttention'")

    def forward(self, x):
        raise NotImplementedError("ParallelSelfAttention.forward: see README.md, 'ParallelSelfAttention'")
