"""Tensor parallelism from torch's own pieces: each shard is an ordinary nn.Linear submodule, attention is
F.scaled_dot_product_attention, and the gathers are one all_gather_into_tensor along dim 0.

The four communication functions are one autograd.Function (setup_context style) given what to do forward and what to do to the
gradient.  A gather moves the last dimension first, all_gather_into_tensor stacks the ranks' pieces, and they
are moved back to the last dimension.  The attention shard keeps its rows of the fused qkv weight regrouped head by head (q, k and v of
one head next to each other), so one reshape splits every local head into its three parts.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _gather_last(x, group):
    n = dist.get_world_size(group)
    front = x.movedim(-1, 0).contiguous()
    out = front.new_empty((n * front.shape[0],) + tuple(front.shape[1:]))
    dist.all_gather_into_tensor(out, front, group=group)
    return out.movedim(0, -1).contiguous()


def _own_last(x, group):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return x.tensor_split(n, dim=-1)[r].contiguous()


def _copy(t, group):
    return t.clone()


def _summed(t, group):
    t = t.contiguous().clone()
    dist.all_reduce(t, group=group)
    return t


class _Mirrored(torch.autograd.Function):
    """One Function for all four, in the setup_context style: ``there`` runs in forward, ``back`` on the
    gradient in backward."""

    @staticmethod
    def forward(x, group, there, back):
        return there(x, group)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, ctx.group, _, ctx.back = inputs

    @staticmethod
    def backward(ctx, grad):
        return ctx.back(grad, ctx.group), None, None, None


def copy_to_tp(x, group=None):
    return _Mirrored.apply(x, group, _copy, _summed)


def reduce_from_tp(x, group=None):
    return _Mirrored.apply(x, group, _summed, _copy)


def gather_from_tp(x, group=None):
    return _Mirrored.apply(x, group, _gather_last, _own_last)


def _scatter_to_tp(x, group):
    return _Mirrored.apply(x, group, _own_last, _gather_last)


def _local_linear(weight, bias):
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype,
                      device=weight.device)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


def _split(size, group, name):
    n = dist.get_world_size(group)
    if size % n:
        raise ValueError(f"{name}={size} does not split evenly over a tensor-parallel group of {n}")
    return size // n, dist.get_rank(group)


class ColumnParallelLinear(nn.Module):
    def __init__(self, full, gather_output=False, group=None):
        super().__init__()
        k, r = _split(full.out_features, group, "out_features")
        own = slice(r * k, (r + 1) * k)
        self.local = _local_linear(full.weight[own], None if full.bias is None else full.bias[own])
        self.gather_output, self.group = gather_output, group

    def forward(self, x):
        y = self.local(copy_to_tp(x, self.group))
        return gather_from_tp(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    def __init__(self, full, input_is_parallel=True, group=None):
        super().__init__()
        k, r = _split(full.in_features, group, "in_features")
        self.local = _local_linear(full.weight[:, r * k:(r + 1) * k], None)
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())
        self.input_is_parallel, self.group = input_is_parallel, group

    def forward(self, x):
        x = x if self.input_is_parallel else _scatter_to_tp(x, self.group)
        y = reduce_from_tp(self.local(x), self.group)
        return y if self.bias is None else y + self.bias


class ParallelMLP(nn.Sequential):
    def __init__(self, fc1, fc2, group=None):
        super().__init__(ColumnParallelLinear(fc1, group=group), nn.GELU(), RowParallelLinear(fc2, group=group))


class ParallelSelfAttention(nn.Module):
    def __init__(self, qkv, proj, num_heads, group=None):
        super().__init__()
        local, r = _split(num_heads, group, "num_heads")
        self.d = qkv.out_features // (3 * num_heads)
        hd = num_heads * self.d
        heads = torch.arange(r * local, (r + 1) * local, device=qkv.weight.device)
        within = torch.arange(self.d, device=qkv.weight.device)
        # head by head: q rows, then k rows, then v rows of that head
        rows = (torch.arange(3, device=heads.device)[None, :, None] * hd + heads[:, None, None] * self.d
                + within[None, None, :]).flatten()
        self.qkv = _local_linear(qkv.weight.index_select(0, rows),
                                 None if qkv.bias is None else qkv.bias.index_select(0, rows))
        self.local_heads = local
        self.proj = RowParallelLinear(proj, group=group)
        self.group = group

    def forward(self, x):
        parts = self.qkv(copy_to_tp(x, self.group)).unflatten(-1, (self.local_heads, 3, self.d))
        q, k, v = (parts.select(-2, i).transpose(-3, -2) for i in range(3))
        context = F.scaled_dot_product_attention(q, k, v)
        return self.proj(context.transpose(-3, -2).flatten(-2))
