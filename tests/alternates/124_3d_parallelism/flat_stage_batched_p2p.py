"""All of a rank's shards in one flat parameter (each block's weights are views cut from it in forward), the
pipeline's messages through dist.batch_isend_irecv, the groups from dist.new_subgroups_by_enumeration, and the
1F1B schedule walked as a list of (kind, micro-batch) pairs."""
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
        raise ValueError(f"dp*tp*pp is {dp * tp * pp}, world_size is {world_size}")
    ranks = torch.arange(world_size).reshape(pp, dp, tp)                  # [pp_rank, dp_rank, tp_rank]
    lists = {"tp": ranks.reshape(-1, tp), "dp": ranks.transpose(1, 2).reshape(-1, dp),
             "pp": ranks.permute(1, 2, 0).reshape(-1, pp)}
    mine = {kind: dist.new_subgroups_by_enumeration(rows.tolist())[0] for kind, rows in lists.items()}
    p, d, t = (int(i) for i in (ranks == dist.get_rank()).nonzero()[0])
    return Groups(mine["dp"], mine["tp"], mine["pp"], d, t, p)


class _F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _one_f_one_b(m, warmup):
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


class Parallel3D(nn.Module):
    def __init__(self, blocks, groups, microbatches, lr):
        super().__init__()
        self.tp_size, self.pp_size = dist.get_world_size(groups.tp_group), dist.get_world_size(groups.pp_group)
        if len(blocks) % self.pp_size:
            raise ValueError(f"{len(blocks)} blocks over pp={self.pp_size} stages")
        per = len(blocks) // self.pp_size
        own = blocks[groups.pp_rank * per:(groups.pp_rank + 1) * per]
        hidden = own[0][0].out_features
        if hidden % self.tp_size:
            raise ValueError(f"hidden {hidden} over tp={self.tp_size}")
        k = hidden // self.tp_size
        rows = slice(groups.tp_rank * k, (groups.tp_rank + 1) * k)
        pieces = []
        for fc1, fc2 in own:
            pieces += [fc1.weight.detach()[rows], fc1.bias.detach()[rows], fc2.weight.detach()[:, rows],
                       fc2.bias.detach()]
        self.shapes = [tuple(t.shape) for t in pieces]
        self.flat = nn.Parameter(torch.cat([t.reshape(-1) for t in pieces]))
        self.groups, self.m, self.lr = groups, microbatches, lr
        s = groups.pp_rank
        self.prev = dist.get_global_rank(groups.pp_group, s - 1) if s > 0 else None
        self.next = dist.get_global_rank(groups.pp_group, s + 1) if s < self.pp_size - 1 else None

    def _views(self):
        parts = self.flat.split([torch.Size(s).numel() for s in self.shapes])
        return [part.view(shape) for part, shape in zip(parts, self.shapes)]

    def forward(self, x):
        views = self._views()
        for i in range(0, len(views), 4):
            w1, b1, w2, b2 = views[i:i + 4]
            x = _F.apply(x, self.groups.tp_group)
            x = _G.apply(F.linear(F.gelu(F.linear(x, w1, b1)), w2), self.groups.tp_group) + b2
        return x

    def _recv(self, like, peer):
        buffer = torch.empty(like.shape, dtype=like.dtype, device=harness.device())
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buffer, peer)]):
            work.wait()
        return buffer

    def train_step(self, x, y):
        self.flat.grad = None
        xs, ys = x.tensor_split(self.m), y.tensor_split(self.m)
        pending, saved, loss = [], {}, 0.0
        for kind, i in _one_f_one_b(self.m, min(self.pp_size - 1 - self.groups.pp_rank, self.m)):
            if kind == "F":
                inp = xs[i] if self.prev is None else self._recv(xs[i], self.prev).requires_grad_()
                out = self(inp)
                if self.next is None:
                    out = F.mse_loss(out, ys[i]) / self.m
                    loss += out.item()
                else:
                    sent = out.detach().contiguous()
                    pending += [(sent, w) for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, self.next)])]
                saved[i] = (inp, out)
            else:
                inp, out = saved.pop(i)
                out.backward(None if self.next is None else self._recv(out, self.next))
                if self.prev is not None:
                    sent = inp.grad.contiguous()
                    pending += [(sent, w) for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, self.prev)])]
        for _, work in pending:
            work.wait()
        grad = self.flat.grad
        dist.all_reduce(grad, group=self.groups.dp_group)
        with torch.no_grad():
            self.flat -= self.lr * grad / dist.get_world_size(self.groups.dp_group)
        return loss if self.next is None else None
