"""Problem 124 reference: 3D parallelism, data x tensor x pipeline, on Megatron's rank order."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import harness

Groups = NamedTuple("Groups", [("dp_group", object), ("tp_group", object), ("pp_group", object),
                               ("dp_rank", int), ("tp_rank", int), ("pp_rank", int)])


def _megatron(p, d, t, dp, tp, pp):
    """Global rank of grid point (pp_rank p, dp_rank d, tp_rank t): tp fastest, then dp, then pp."""
    return p * dp * tp + d * tp + t


def _build_groups(dp, tp, pp, rank_of):
    """Every group of every kind, created in the same order on every rank; this rank's three and coordinates."""
    me = dist.get_rank()
    grid = [(p, d, t) for p in range(pp) for d in range(dp) for t in range(tp)]
    p0, d0, t0 = next(c for c in grid if rank_of(*c, dp, tp, pp) == me)
    varying = {"tp": lambda p, d, i: (p, d, i), "dp": lambda p, t, i: (p, i, t), "pp": lambda d, t, i: (i, d, t)}
    outer = {"tp": (pp, dp, tp), "dp": (pp, tp, dp), "pp": (dp, tp, pp)}
    mine = {}
    for kind, point in varying.items():
        a_size, b_size, n = outer[kind]
        for a in range(a_size):
            for b in range(b_size):
                ranks = [rank_of(*point(a, b, i), dp, tp, pp) for i in range(n)]
                group = dist.new_group(ranks)
                if me in ranks:
                    mine[kind] = group
    return Groups(mine["dp"], mine["tp"], mine["pp"], d0, t0, p0)


def make_groups(world_size: int, dp: int, tp: int, pp: int) -> Groups:
    if dp * tp * pp != world_size:
        raise ValueError(f"dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp} is not the world size {world_size}")
    return _build_groups(dp, tp, pp, _megatron)


def _summed(t, group):
    t = t.contiguous().clone()
    dist.all_reduce(t, group=group)
    return t


class _TPAllReduce(torch.autograd.Function):
    """Megatron's g (sum in forward, gradient passes) or, with in_forward=False, f (the mirror image)."""

    @staticmethod
    def forward(ctx, x, group, in_forward):
        ctx.group, ctx.in_forward = group, in_forward
        return _summed(x, group) if in_forward else x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (grad if ctx.in_forward else _summed(grad, ctx.group)), None, None


class TPBlock(nn.Module):
    """fc2(gelu(fc1(x))): fc1 column-parallel (rows of its weight), fc2 row-parallel (columns), bias once."""

    def __init__(self, fc1: nn.Linear, fc2: nn.Linear, group):
        super().__init__()
        n, r = dist.get_world_size(group), dist.get_rank(group)
        k = fc1.out_features // n
        own = slice(r * k, (r + 1) * k)
        self.group = group
        self.w1 = nn.Parameter(fc1.weight.detach()[own].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[own].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, own].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x):
        x = _TPAllReduce.apply(x, self.group, False)                     # f
        partial = F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2)
        return _TPAllReduce.apply(partial, self.group, True) + self.b2   # g, then the bias once


def _one_f_one_b(m: int, warmup: int) -> list:
    """118's 1F1B op list for one stage."""
    steady = [op for i in range(m - warmup) for op in (("F", warmup + i), ("B", i))]
    return [("F", i) for i in range(warmup)] + steady + [("B", i) for i in range(m - warmup, m)]


class Parallel3D(nn.Module):
    def __init__(self, blocks, groups: Groups, microbatches: int, lr: float):
        super().__init__()
        self.groups, self.m, self.lr = groups, microbatches, lr
        tp = dist.get_world_size(groups.tp_group)
        self.pp = dist.get_world_size(groups.pp_group)
        per, left = divmod(len(blocks), self.pp)
        if left:
            raise ValueError(f"{len(blocks)} blocks cannot be split into pp={self.pp} equal stages")
        s = groups.pp_rank
        mine = blocks[s * per:(s + 1) * per]         # this stage's blocks: the only ones this rank is given
        hidden = mine[0][0].out_features
        if hidden % tp:
            raise ValueError(f"hidden width {hidden} is not divisible by tp={tp}")
        self.blocks = nn.ModuleList(TPBlock(fc1, fc2, groups.tp_group) for fc1, fc2 in mine)
        self.prev = dist.get_global_rank(groups.pp_group, s - 1) if s > 0 else None
        self.next = dist.get_global_rank(groups.pp_group, s + 1) if s < self.pp - 1 else None

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    def _pipeline(self, xs, ys):
        """1F1B over this replica's micro-batches; returns the sum of loss / m on the last stage."""
        like, saved, posted, total = xs[0], {}, [], 0.0

        def receive(peer):
            buffer = torch.empty(like.shape, dtype=like.dtype, device=harness.device())
            dist.irecv(buffer, peer).wait()
            return buffer

        def post(tensor, peer):                   # gloo's send blocks: post it, wait at the end
            tensor = tensor.detach().contiguous()
            posted.append((tensor, dist.isend(tensor, peer)))

        for kind, i in _one_f_one_b(self.m, min(self.pp - self.groups.pp_rank - 1, self.m)):
            if kind == "F":
                x = xs[i] if self.prev is None else receive(self.prev).requires_grad_()
                out = self(x)
                if self.next is None:
                    out = self._loss(out, ys[i])
                    total += out.item()
                else:
                    post(out, self.next)
                saved[i] = (x, out)
                continue
            x, out = saved.pop(i)
            out.backward(None if self.next is None else receive(self.next))
            if self.prev is not None:
                post(x.grad, self.prev)
        for _, work in posted:
            work.wait()
        return total if self.next is None else None

    def _loss(self, out, y):
        """A micro-batch's share of the replica's MSE."""
        return F.mse_loss(out, y) / self.m

    def _average_over_dp(self):
        """One flat all_reduce of every gradient in the dp group, divided by dp."""
        params, dp = list(self.parameters()), dist.get_world_size(self.groups.dp_group)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.groups.dp_group)
        flat /= dp
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))

    def train_step(self, x, y):
        xs, ys = x.tensor_split(self.m), y.tensor_split(self.m)   # this replica's rows (real on its role's stage)
        for p in self.parameters():
            p.grad = None
        loss = self._pipeline(xs, ys)
        self._average_over_dp()
        with torch.no_grad():
            for p in self.parameters():
                p -= self.lr * p.grad
        return loss
