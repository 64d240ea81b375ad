"""Tensor parallelism without a single autograd.Function: the communication runs in tensor hooks and
straight-through expressions, and the weights are stored transposed, with q, k and v as three parameters.

* copy_to_tp: a fresh view of x whose gradient hook all-reduces the gradient on its way to x.
* reduce_from_tp: x + (sum - x).detach(): the value is the all-reduced sum, the gradient passes unchanged.
* gather_from_tp: the other ranks' received pieces are constants, this rank's piece is x itself, so the
  gradient of the concatenation keeps exactly this rank's slice.
* RowParallelLinear(input_is_parallel=False): a view of x whose gradient hook all-gathers the slices.
The column layer keeps weight.T ([in, out/N]) and computes x @ w_t + b.
"""
import math

import torch
import torch.distributed as dist
from torch import nn


def _place(group):
    return dist.get_world_size(group), dist.get_rank(group)


def _all_reduced(t, group):
    t = t.detach().clone().contiguous()
    dist.all_reduce(t, group=group)
    return t


def _gathered_pieces(t, group):
    n, _ = _place(group)
    pieces = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(pieces, t.detach().contiguous(), group=group)
    return pieces


def copy_to_tp(x, group=None):
    y = x.view_as(x)
    if y.requires_grad:
        y.register_hook(lambda grad: _all_reduced(grad, group))
    return y


def reduce_from_tp(x, group=None):
    total = _all_reduced(x, group)
    return x + (total - x.detach())


def gather_from_tp(x, group=None):
    _, r = _place(group)
    pieces = _gathered_pieces(x, group)
    pieces[r] = x
    return torch.cat(pieces, dim=-1)


def _scatter_to_tp(x, group):
    """This rank's slice of the last dim; its gradient comes back full, all-gathered from every rank's slice."""
    n, r = _place(group)
    k = x.shape[-1] // n
    whole = x.view_as(x)
    if whole.requires_grad:
        whole.register_hook(lambda grad: torch.cat(_gathered_pieces(grad[..., r * k:(r + 1) * k], group), dim=-1))
    return whole[..., r * k:(r + 1) * k]


def _own(size, group, what):
    n, r = _place(group)
    if size % n:
        raise ValueError(f"{what} = {size} cannot be split over {n} ranks")
    k = size // n
    return r * k, (r + 1) * k


def _copy(t):
    return None if t is None else nn.Parameter(t.detach().clone())


class ColumnParallelLinear(nn.Module):
    def __init__(self, full, gather_output=False, group=None):
        super().__init__()
        a, b = _own(full.out_features, group, "out_features")
        self.w_t = _copy(full.weight[a:b].t())
        self.b = _copy(None if full.bias is None else full.bias[a:b])
        self.gather_output, self.group = gather_output, group

    def forward(self, x):
        y = copy_to_tp(x, self.group) @ self.w_t
        if self.b is not None:
            y = y + self.b
        return gather_from_tp(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    def __init__(self, full, input_is_parallel=True, group=None):
        super().__init__()
        a, b = _own(full.in_features, group, "in_features")
        self.w = _copy(full.weight[:, a:b])
        self.b = _copy(full.bias)
        self.input_is_parallel, self.group = input_is_parallel, group

    def forward(self, x):
        if not self.input_is_parallel:
            x = _scatter_to_tp(x, self.group)
        y = reduce_from_tp(x @ self.w.t(), self.group)
        return y if self.b is None else y + self.b


class ParallelMLP(nn.Module):
    def __init__(self, fc1, fc2, group=None):
        super().__init__()
        self.up = ColumnParallelLinear(fc1, group=group)
        self.down = RowParallelLinear(fc2, group=group)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class ParallelSelfAttention(nn.Module):
    def __init__(self, qkv, proj, num_heads, group=None):
        super().__init__()
        first, last = _own(num_heads, group, "num_heads")
        self.d = qkv.out_features // (3 * num_heads)
        hd = num_heads * self.d
        rows = [slice(part * hd + first * self.d, part * hd + last * self.d) for part in range(3)]
        self.wq, self.wk, self.wv = (_copy(qkv.weight[s]) for s in rows)
        self.bq, self.bk, self.bv = (_copy(None if qkv.bias is None else qkv.bias[s]) for s in rows)
        self.heads = last - first
        self.proj = RowParallelLinear(proj, group=group)
        self.group = group

    def _heads(self, x, w, b):
        t = x @ w.t() + (0 if b is None else b)
        return t.unflatten(-1, (self.heads, self.d)).transpose(-3, -2)

    def forward(self, x):
        x = copy_to_tp(x, self.group)
        q, k, v = (self._heads(x, w, b) for w, b in ((self.wq, self.bq), (self.wk, self.bk), (self.wv, self.bv)))
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d), dim=-1) @ v
        return self.proj(attention.transpose(-3, -2).flatten(-2))
