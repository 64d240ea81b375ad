"""Problem 121 reference: Megatron sequence parallelism (SP) around a tensor-parallel MLP block."""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _gather_rows(x, group):
    """[s/t, ...] on each rank -> [s, ...]: every rank's rows, concatenated along dim 0 in rank order."""
    x = x.contiguous()
    out = x.new_empty((dist.get_world_size(group) * x.shape[0],) + tuple(x.shape[1:]))
    dist.all_gather_into_tensor(out, x, group=group)
    return out


def _scatter_rows(x, group):
    """[s, ...] on each rank -> [s/t, ...]: this rank's block of rows of the sum over ranks."""
    t = dist.get_world_size(group)
    if x.shape[0] % t:
        raise ValueError(f"reduce_scatter_sequence: s={x.shape[0]} is not divisible by the tensor-parallel size {t}")
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // t,) + tuple(x.shape[1:]))
    dist.reduce_scatter_tensor(out, x, group=group)
    return out


class _Mirror(torch.autograd.Function):
    """One collective forward, its mirror image backward.

    all-gather -> reduce-scatter: every rank used the whole gathered sequence through its own fc1
    columns, so its gradient of it is a partial sum; this rank's rows of the input gradient are the
    sum over ranks of those rows.  reduce-scatter -> all-gather: every rank's partial sum fed every
    row of the sum, so each rank needs the gradient of all s rows.
    """

    @staticmethod
    def forward(ctx, x, group, there, back):
        ctx.group, ctx.back = group, back
        return there(x, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.back(grad, ctx.group), None, None, None


def all_gather_sequence(x, group=None):
    return _Mirror.apply(x, group, _gather_rows, _scatter_rows)


def reduce_scatter_sequence(x, group=None):
    return _Mirror.apply(x, group, _scatter_rows, _gather_rows)


class SequenceParallelMLP(nn.Module):
    """x + fc2(gelu(fc1(ln(x)))), with x, ln and the residual on s/t rows and fc1/fc2 tensor-parallel."""

    def __init__(self, ln: nn.LayerNorm, fc1: nn.Linear, fc2: nn.Linear, group=None):
        super().__init__()
        t, r = dist.get_world_size(group), dist.get_rank(group)
        if fc1.out_features % t:
            raise ValueError(f"SequenceParallelMLP: fc1.out_features={fc1.out_features} is not divisible by the "
                             f"tensor-parallel size {t}")
        own = slice(r * fc1.out_features // t, (r + 1) * fc1.out_features // t)
        self.ln = copy.deepcopy(ln)                                             # replicated
        self.fc1_weight = nn.Parameter(fc1.weight.detach()[own].clone())        # columns of fc1: rows of W1
        self.fc1_bias = None if fc1.bias is None else nn.Parameter(fc1.bias.detach()[own].clone())
        self.fc2_weight = nn.Parameter(fc2.weight.detach()[:, own].clone())     # rows of fc2: columns of W2
        self.fc2_bias = None if fc2.bias is None else nn.Parameter(fc2.bias.detach().clone())   # replicated
        self.group = group

    def forward(self, x):
        full = all_gather_sequence(self.ln(x), self.group)                      # LN on s/t rows, then [s, b, h]
        partial = F.linear(F.gelu(F.linear(full, self.fc1_weight, self.fc1_bias)), self.fc2_weight)
        y = reduce_scatter_sequence(partial, self.group)                        # summed, this rank's s/t rows
        if self.fc2_bias is not None:
            y = y + self.fc2_bias                                               # once, after the reduction
        return x + y

    def finish_grad_sync(self):
        """Each rank's replicated gradients cover only its own rows; the full gradient is their sum."""
        grads = [p.grad for p in [*self.ln.parameters(), self.fc2_bias] if p is not None and p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=self.group)
        for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(summed.view_as(g))
