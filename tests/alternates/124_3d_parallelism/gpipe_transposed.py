"""GPipe instead of 1F1B (every micro-batch's forward, then every backward, last first), weights kept transposed
(x @ W^T stored as W^T), blocking receives with dist.recv, one dp all_reduce per parameter, and the groups made pp
first, then dp, then tp."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import harness

Groups = NamedTuple("Groups", [("dp_group", object), ("tp_group", object), ("pp_group", object),
                               ("dp_rank", int), ("tp_rank", int), ("pp_rank", int)])


def make_groups(world_size, dp, tp, pp):
    if dp * tp * pp != world_size:
        raise ValueError(f"dp*tp*pp = {dp * tp * pp} but world_size = {world_size}")
    me = dist.get_rank()
    rank = lambda p, d, t: (p * dp + d) * tp + t   # noqa: E731
    lists = {"pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
             "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
             "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)]}
    mine = {}
    for kind in ("pp", "dp", "tp"):
        for ranks in lists[kind]:
            group = dist.new_group(ranks)
            if me in ranks:
                mine[kind] = group
    pp_rank, rest = divmod(me, dp * tp)
    dp_rank, tp_rank = divmod(rest, tp)
    return Groups(mine["dp"], mine["tp"], mine["pp"], dp_rank, tp_rank, pp_rank)


class _Reduce(torch.autograd.Function):
    """g: the partial outputs summed over the tp group; the gradient passes unchanged."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Copy(torch.autograd.Function):
    """f: the input passes unchanged; its gradient is summed over the tp group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _transposed(w):
    """W^T in memory of its own, row-major."""
    return w.T.clone(memory_format=torch.contiguous_format)


class Parallel3D(nn.Module):
    def __init__(self, blocks, groups, microbatches, lr):
        super().__init__()
        tp, pp = dist.get_world_size(groups.tp_group), dist.get_world_size(groups.pp_group)
        if len(blocks) % pp:
            raise ValueError(f"pp={pp} does not divide the {len(blocks)} blocks")
        per = len(blocks) // pp
        own = blocks[groups.pp_rank * per:(groups.pp_rank + 1) * per]
        if own[0][0].out_features % tp:
            raise ValueError(f"tp={tp} does not divide the hidden width {own[0][0].out_features}")
        k = own[0][0].out_features // tp
        cols = slice(groups.tp_rank * k, (groups.tp_rank + 1) * k)
        self.w1t = nn.ParameterList(nn.Parameter(_transposed(fc1.weight.detach()[cols])) for fc1, _ in own)
        self.b1 = nn.ParameterList(nn.Parameter(fc1.bias.detach()[cols].clone()) for fc1, _ in own)
        self.w2t = nn.ParameterList(nn.Parameter(_transposed(fc2.weight.detach()[:, cols])) for _, fc2 in own)
        self.b2 = nn.ParameterList(nn.Parameter(fc2.bias.detach().clone()) for _, fc2 in own)
        self.groups, self.m, self.lr, self.pp = groups, microbatches, lr, pp
        s = groups.pp_rank
        self.up = dist.get_global_rank(groups.pp_group, s - 1) if s > 0 else None
        self.down = dist.get_global_rank(groups.pp_group, s + 1) if s < pp - 1 else None

    def _stage(self, x):
        for w1t, b1, w2t, b2 in zip(self.w1t, self.b1, self.w2t, self.b2):
            x = _Copy.apply(x, self.groups.tp_group)
            x = _Reduce.apply(F.gelu(x @ w1t + b1) @ w2t, self.groups.tp_group) + b2
        return x

    def train_step(self, x, y):
        for p in self.parameters():
            p.grad = None
        xs, ys = x.tensor_split(self.m), y.tensor_split(self.m)
        sends, kept, total = [], [], 0.0
        for i in range(self.m):                                   # all forwards
            if self.up is None:
                inp = xs[i]
            else:
                inp = torch.empty(xs[i].shape, dtype=xs[i].dtype, device=harness.device())
                dist.recv(inp, self.up)
                inp.requires_grad_()
            out = self._stage(inp)
            if self.down is None:
                out = F.mse_loss(out, ys[i]) / self.m
                total += float(out)
            else:
                sends.append(dist.isend(out.detach().contiguous(), self.down))
            kept.append((inp, out))
        for i in reversed(range(self.m)):                         # all backwards, last micro-batch first
            inp, out = kept[i]
            if self.down is None:
                out.backward()
            else:
                grad = torch.empty(out.shape, dtype=out.dtype, device=harness.device())
                dist.recv(grad, self.down)
                out.backward(grad)
            if self.up is not None:
                sends.append(dist.isend(inp.grad.contiguous(), self.up))
        for work in sends:
            work.wait()
        dp = dist.get_world_size(self.groups.dp_group)
        with torch.no_grad():
            for p in self.parameters():
                dist.all_reduce(p.grad, group=self.groups.dp_group)
                p -= self.lr * p.grad / dp
        return total if self.down is None else None
