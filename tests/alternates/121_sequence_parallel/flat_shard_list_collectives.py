"""A correct sequence-parallel block with list-form collectives and flat parameters.

* The two functions are autograd Functions over the list forms: dist.all_gather into a list of t row blocks
  (then torch.cat), and dist.reduce_scatter from the list of x's t row blocks;
* the module keeps two flat parameters: one for this rank's shard (fc1's rows, fc1's bias entries and fc2's
  columns, flattened one after another) and one for the replicated entries (ln.weight, ln.bias, fc2.bias);
  forward takes views of them, and finish_grad_sync all-reduces the replicated one's gradient in one call.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _gather(x, group):
    blocks = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(blocks, x.contiguous(), group=group)
    return torch.cat(blocks)


def _scatter(x, group):
    t = dist.get_world_size(group)
    if x.shape[0] % t:
        raise ValueError(f"reduce_scatter_sequence: x has s = {x.shape[0]} rows, which t = {t} ranks cannot share")
    blocks = [b.contiguous() for b in x.chunk(t)]
    out = torch.empty_like(blocks[0])
    dist.reduce_scatter(out, blocks, group=group)
    return out


class _Collective(torch.autograd.Function):
    """A gather whose backward is a scatter, or a scatter whose backward is a gather."""

    @staticmethod
    def forward(ctx, x, group, gathers):
        ctx.group, ctx.gathers = group, gathers
        return _gather(x, group) if gathers else _scatter(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _scatter(grad, ctx.group) if ctx.gathers else _gather(grad, ctx.group), None, None


def all_gather_sequence(x, group=None):
    return _Collective.apply(x, group, True)


def reduce_scatter_sequence(x, group=None):
    return _Collective.apply(x, group, False)


def _flat(tensors):
    """One flat parameter holding copies of ``tensors`` (None skipped), and the shapes to view it back as."""
    kept = [t.detach() for t in tensors if t is not None]
    return nn.Parameter(torch.cat([t.reshape(-1) for t in kept]).clone()), [t.shape for t in kept]


def _views(flat, shapes):
    sizes = [s.numel() for s in shapes]
    return [piece.view(shape) for piece, shape in zip(flat.split(sizes), shapes)]


class SequenceParallelMLP(nn.Module):
    def __init__(self, ln, fc1, fc2, group=None):
        super().__init__()
        t, r = dist.get_world_size(group), dist.get_rank(group)
        if fc1.out_features % t:
            raise ValueError(f"SequenceParallelMLP: fc1.out_features = {fc1.out_features} does not divide over "
                             f"t = {t} ranks")
        part = fc1.out_features // t
        rows = slice(r * part, (r + 1) * part)
        self.group, self.eps, self.biased = group, ln.eps, fc1.bias is not None
        self.shard, self.shard_shapes = _flat([fc1.weight[rows], None if fc1.bias is None else fc1.bias[rows],
                                               fc2.weight[:, rows]])
        self.replicated, self.replicated_shapes = _flat([ln.weight, ln.bias, fc2.bias])

    def forward(self, x):
        shard, replicated = _views(self.shard, self.shard_shapes), _views(self.replicated, self.replicated_shapes)
        w1, b1, w2 = shard if self.biased else (shard[0], None, shard[1])
        gamma, beta, *b2 = replicated
        full = all_gather_sequence(F.layer_norm(x, gamma.shape, gamma, beta, self.eps), self.group)
        y = reduce_scatter_sequence(F.linear(F.gelu(F.linear(full, w1, b1)), w2), self.group)
        return x + y + (b2[0] if b2 else 0)

    def finish_grad_sync(self):
        if self.replicated.grad is not None:
            dist.all_reduce(self.replicated.grad, group=self.group)
