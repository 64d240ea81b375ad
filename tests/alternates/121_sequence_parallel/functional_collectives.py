"""A correct sequence-parallel block built on torch's autograd-aware functional collectives.

* all_gather_sequence / reduce_scatter_sequence are torch.distributed._functional_collectives'
  all_gather_tensor_autograd and reduce_scatter_tensor_autograd: torch's own differentiable collectives,
  whose backward is the mirror collective (no hand-written autograd.Function);
* the block keeps fc1's shard transposed ([h, f/t], used as x @ W) and applies its LayerNorm with
  F.layer_norm on parameters of its own; finish_grad_sync all-reduces each replicated gradient on its own.
"""
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn


def _group(group):
    return dist.group.WORLD if group is None else group


def all_gather_sequence(x, group=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return funcol.all_gather_tensor_autograd(x.contiguous(), 0, _group(group)).wait()


def reduce_scatter_sequence(x, group=None):
    t = dist.get_world_size(group)
    if x.shape[0] % t:
        raise ValueError(f"reduce_scatter_sequence: s = {x.shape[0]} rows do not split over t = {t} ranks")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return funcol.reduce_scatter_tensor_autograd(x.contiguous(), "sum", 0, _group(group)).wait()


class SequenceParallelMLP(nn.Module):
    def __init__(self, ln, fc1, fc2, group=None):
        super().__init__()
        t, r = dist.get_world_size(group), dist.get_rank(group)
        f = fc1.out_features
        if f % t:
            raise ValueError(f"SequenceParallelMLP: f = {f} features do not split over t = {t} ranks")
        mine = slice(r * f // t, (r + 1) * f // t)
        self.group, self.eps = group, ln.eps
        self.gamma = nn.Parameter(ln.weight.detach().clone())
        self.beta = nn.Parameter(ln.bias.detach().clone())
        self.up = nn.Parameter(fc1.weight.detach()[mine].t().clone())            # [h, f/t]
        self.up_bias = None if fc1.bias is None else nn.Parameter(fc1.bias.detach()[mine].clone())
        self.down = nn.Parameter(fc2.weight.detach()[:, mine].clone())           # [h, f/t]
        self.down_bias = None if fc2.bias is None else nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x):
        normed = F.layer_norm(x, self.gamma.shape, self.gamma, self.beta, self.eps)
        hidden = all_gather_sequence(normed, self.group) @ self.up
        if self.up_bias is not None:
            hidden = hidden + self.up_bias
        y = reduce_scatter_sequence(F.gelu(hidden) @ self.down.t(), self.group)
        return x + (y if self.down_bias is None else y + self.down_bias)

    def finish_grad_sync(self):
        for p in (self.gamma, self.beta, self.down_bias):
            if p is not None and p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)
