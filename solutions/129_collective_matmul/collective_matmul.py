"""Problem 129 reference: collective matmul (async tensor parallelism).

The sequence is split in N chunks of c rows, chunk r on group rank r.  Both functions run a ring of N - 1
hops of chunk-sized messages, and each hop travels while the rank multiplies what it already holds:

    all_gather_matmul:     out = [x_0; x_1; ...; x_{N-1}] @ w        the x chunks travel
    matmul_reduce_scatter: out = rows r of  sum_j x_j @ w_j          the partial sums travel

Each is the other's backward: the input gradient of an all-gather + GEMM is a GEMM + reduce-scatter of
dout @ wᵀ, and the other way round.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class Ring:
    """This rank's place in the ring of ``group``: its index, the ring's size and its two neighbours (global)."""

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.next = self.global_rank((self.rank + 1) % self.size)
        self.prev = self.global_rank((self.rank - 1) % self.size)

    def global_rank(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def source(self, step: int) -> int:
        """Whose chunk this rank holds after ``step`` hops: every message goes to the next rank."""
        return (self.rank - step) % self.size

    def pass_on(self, tensor):
        """Post an isend of ``tensor`` to the next rank and an irecv of one like it from the previous one."""
        arriving = torch.empty_like(tensor)
        works = [dist.isend(tensor, self.next, group=self.group),
                 dist.irecv(arriving, self.prev, group=self.group)]
        return arriving, works


def wait_all(works):
    for work in works:
        work.wait()


def rows(t, chunk: int, c: int):
    """Chunk ``chunk`` of dim 0 (c rows each): a view."""
    return t[chunk * c:(chunk + 1) * c]


def as_matrix(t):
    """[rows, ..., features] -> [rows * ..., features]: what a weight gradient sums over."""
    return t.reshape(-1, t.shape[-1])


class CollectiveMatmul:
    """The two rings, one overridable piece per method."""

    def ring(self, group) -> Ring:
        return Ring(group)

    def all_gather_matmul(self, ring: Ring, x, w):
        """(x gathered along dim 0) @ w, and the gathered x; chunk j's matmul runs while chunk j + 1 travels."""
        c, held = x.shape[0], x.contiguous()
        out = x.new_empty((ring.size * c, *x.shape[1:-1], w.shape[-1]))
        gathered = x.new_empty((ring.size * c, *x.shape[1:]))
        for step in range(ring.size):
            last = step == ring.size - 1
            if not last:                           # post the next hop first ...
                arriving, works = ring.pass_on(held)
            j = ring.source(step)
            rows(out, j, c)[...] = held @ w        # ... multiply the chunk held while it travels ...
            rows(gathered, j, c)[...] = held
            if not last:                           # ... and only then wait for it
                wait_all(works)
                held = arriving
        return out, gathered

    def check_divisible(self, ring: Ring, x):
        if x.shape[0] % ring.size:
            raise ValueError(f"matmul_reduce_scatter: the sequence length {x.shape[0]} (x.shape[0]) is not "
                             f"divisible by the group size N = {ring.size}")

    def matmul_reduce_scatter(self, ring: Ring, x, w):
        """Rows ``ring.rank`` of sum over the ranks of x @ w: each partial sum goes round the ring, every rank
        adding its own product of that chunk, and ends at the rank that owns the chunk."""
        self.check_divisible(ring, x)
        c = x.shape[0] // ring.size
        arriving, works = None, []                 # nothing in flight before the first step
        for step in range(ring.size):
            j = ring.source(step + 1)              # the chunk whose partial sum arrives this step (last: own)
            partial = rows(x, j, c) @ w            # computed while that partial sum travels
            wait_all(works)
            if arriving is not None:
                partial = partial + arriving
            if step < ring.size - 1:
                arriving, works = ring.pass_on(partial)
        return partial


class _AllGatherMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, group, algorithm):
        ring = algorithm.ring(group)
        out, gathered = algorithm.all_gather_matmul(ring, x, w)
        ctx.save_for_backward(gathered, w)
        ctx.ring, ctx.algorithm = ring, algorithm
        return out

    @staticmethod
    def backward(ctx, dout):
        gathered, w = ctx.saved_tensors
        dout = dout.contiguous()
        dx = ctx.algorithm.matmul_reduce_scatter(ctx.ring, dout, w.t())   # every rank's dout_j @ w_jᵀ, summed
        dw = as_matrix(gathered).t() @ as_matrix(dout)
        return dx, dw, None, None


class _MatmulReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, group, algorithm):
        ring = algorithm.ring(group)
        out = algorithm.matmul_reduce_scatter(ring, x, w)
        ctx.save_for_backward(x, w)
        ctx.ring, ctx.algorithm = ring, algorithm
        return out

    @staticmethod
    def backward(ctx, dout):
        x, w = ctx.saved_tensors
        dx, dout_gathered = ctx.algorithm.all_gather_matmul(ctx.ring, dout, w.t())
        dw = as_matrix(x).t() @ as_matrix(dout_gathered)
        return dx, dw, None, None


def all_gather_matmul(x, w, group=None):
    return _AllGatherMatmul.apply(x, w, group, CollectiveMatmul())


def matmul_reduce_scatter(x, w, group=None):
    return _MatmulReduceScatter.apply(x, w, group, CollectiveMatmul())
