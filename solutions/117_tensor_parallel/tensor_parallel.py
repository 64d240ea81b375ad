"""Problem 117 reference: Megatron tensor parallelism, column- and row-parallel layers."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _split_last(x, group):
    """This rank's contiguous slice of the last dimension."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(n, dim=-1)[r].contiguous()


def _gather_last(x, group):
    """Every rank's x, concatenated along the last dimension in rank order."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=-1)


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad, ctx.group), None


class _ScatterToTP(torch.autograd.Function):
    """Keep own slice forward, all_gather backward: the mirror image of gather_from_tp."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.group), None


def copy_to_tp(x, group=None):
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x, group=None):
    return _ReduceFromTP.apply(x, group)


def gather_from_tp(x, group=None):
    return _GatherFromTP.apply(x, group)


def _shard(tensor, index, dim):
    """A parameter holding ``tensor``'s entries at ``index`` along ``dim``, in its own storage."""
    if tensor is None:
        return None
    return nn.Parameter(tensor.detach().index_select(dim, index).clone())


def _own_range(size, group, what, device):
    """This rank's indices along a dimension of ``size``, on ``device`` (the full weight's: index_select's)."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if size % n:
        raise ValueError(f"{what}={size} is not divisible by the tensor-parallel size {n}")
    k = size // n
    return torch.arange(r * k, (r + 1) * k, device=device)


class ColumnParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, gather_output=False, group=None):
        super().__init__()
        rows = _own_range(full.out_features, group, "ColumnParallelLinear: out_features", full.weight.device)
        self.weight, self.bias = _shard(full.weight, rows, 0), _shard(full.bias, rows, 0)
        self.gather_output, self.group = gather_output, group

    def forward(self, x):
        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)
        return gather_from_tp(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    def __init__(self, full: nn.Linear, input_is_parallel=True, group=None):
        super().__init__()
        cols = _own_range(full.in_features, group, "RowParallelLinear: in_features", full.weight.device)
        self.weight = _shard(full.weight, cols, 1)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())
        self.input_is_parallel, self.group = input_is_parallel, group

    def forward(self, x):
        if not self.input_is_parallel:
            x = _ScatterToTP.apply(x, self.group)
        y = reduce_from_tp(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class ParallelMLP(nn.Module):
    def __init__(self, fc1: nn.Linear, fc2: nn.Linear, group=None):
        super().__init__()
        self.fc1 = ColumnParallelLinear(fc1, gather_output=False, group=group)
        self.fc2 = RowParallelLinear(fc2, input_is_parallel=True, group=group)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _qkv_rows(num_heads, head_dim, group, device):
    """Rows of the fused [q; k; v] weight that hold this rank's heads, in q, k, v order."""
    heads = _own_range(num_heads, group, "ParallelSelfAttention: num_heads", device)
    per_head = (heads[:, None] * head_dim + torch.arange(head_dim, device=device)).flatten()
    return torch.cat([part * num_heads * head_dim + per_head for part in range(3)])


class ParallelSelfAttention(nn.Module):
    def __init__(self, qkv: nn.Linear, proj: nn.Linear, num_heads, group=None):
        super().__init__()
        if qkv.out_features % (3 * num_heads):
            raise ValueError(f"ParallelSelfAttention: qkv.out_features={qkv.out_features} is not "
                             f"3 * num_heads * head_dim for num_heads={num_heads}")
        self.head_dim = qkv.out_features // (3 * num_heads)
        rows = _qkv_rows(num_heads, self.head_dim, group, qkv.weight.device)
        self.local_heads = num_heads // dist.get_world_size(group)
        self.qkv_weight, self.qkv_bias = _shard(qkv.weight, rows, 0), _shard(qkv.bias, rows, 0)
        self.proj = RowParallelLinear(proj, input_is_parallel=True, group=group)
        self.group = group

    def forward(self, x):
        qkv = F.linear(copy_to_tp(x, self.group), self.qkv_weight, self.qkv_bias)
        q, k, v = (t.unflatten(-1, (self.local_heads, self.head_dim)).transpose(-3, -2)
                   for t in qkv.chunk(3, dim=-1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        context = (scores.softmax(dim=-1) @ v).transpose(-3, -2).flatten(-2)
        return self.proj(context)
