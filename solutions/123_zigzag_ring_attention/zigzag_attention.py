"""Problem 123 reference: zigzag ring attention, causal, forward and backward.

The sequence (dim 2 of [B, H, S, D]) is cut into 2N chunks of c = S / 2N positions; rank r holds
chunks r and 2N-1-r, one early and one late.  Queries stay; K/V shards travel one hop downstream
per step.  Block (query chunk i, key chunk j) is computed whole when j < i, whole under a triangle
mask when j == i, and skipped when j > i: chunk i needs i + 1 blocks, so every rank computes
(r + 1) + (2N - r) = 2N + 1 of them.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

SEQ = 2   # the sequence dimension of [B, H, S, D]


def zigzag_chunks(rank: int, world: int) -> tuple:
    """The two chunks of the 2N that ``rank`` holds, in the order it holds them."""
    return rank, 2 * world - 1 - rank


def check_layout(x, rank, world):
    """ValueError unless ``rank`` is one of 0..N-1 and 2N divides ``x``'s sequence length."""
    if not 0 <= rank < world:
        raise ValueError(f"zigzag_shard: rank {rank} is not one of 0..{world - 1}")
    if x.shape[SEQ] % (2 * world):
        raise ValueError(f"zigzag_shard: sequence length {x.shape[SEQ]} is not divisible by 2N = {2 * world}")


def zigzag_shard(x, rank, world):
    """Chunks r and 2N-1-r of the 2N equal chunks of ``x``'s sequence dimension, concatenated."""
    check_layout(x, rank, world)
    pieces = x.tensor_split(2 * world, dim=SEQ)
    return torch.cat([pieces[i] for i in zigzag_chunks(rank, world)], dim=SEQ)


class Ring:
    """This rank's seat in ``group``; shards move downstream, from group rank i to i + 1."""

    def __init__(self, group=None):
        self.group, self.rank, self.size = group, dist.get_rank(group), dist.get_world_size(group)

        def seat(i):
            return i % self.size if group is None else dist.get_global_rank(group, i % self.size)
        self.downstream, self.upstream = seat(self.rank + 1), seat(self.rank - 1)

    def hop(self, *tensors):
        """Each tensor goes downstream while one like it comes from upstream; returns wait() -> what came."""
        inbox, works = [torch.empty_like(t) for t in tensors], []
        for mine, theirs in zip(tensors, inbox):
            works += [dist.isend(mine, self.downstream, group=self.group),
                      dist.irecv(theirs, self.upstream, group=self.group)]

        def wait():
            for work in works:
                work.wait()
            return inbox
        return wait


class ZigzagAttention:
    """The algorithm, one overridable piece per method.  One instance per call."""

    def __call__(self, q, k, v, group=None):
        return _ZigzagFunction.apply(q, k, v, group, self)

    def positions(self, rank, world, c, device):
        """Global sequence positions of the shard ``rank`` holds."""
        return torch.cat([i * c + torch.arange(c, device=device) for i in zigzag_chunks(rank, world)])

    def needed(self, mask) -> bool:
        """Compute a block only when some query may see some key in it."""
        return bool(mask.any())

    def blocks(self, ring, source, c, device):
        """(query half, key half, mask or None) for each block to compute against ``source``'s shard."""
        q_pos = self.positions(ring.rank, ring.size, c, device).split(c)
        k_pos = self.positions(source, ring.size, c, device).split(c)
        for a, qp in enumerate(q_pos):
            for b, kp in enumerate(k_pos):
                mask = qp[:, None] >= kp[None, :]       # causal, on global positions
                if self.needed(mask):
                    yield a, b, None if bool(mask.all()) else mask

    def around(self, ring, k, v):
        """Yield (whose shard, its k, its v) once per hop; the next shard travels while the caller computes."""
        for hops in range(ring.size):
            wait = ring.hop(k, v) if hops < ring.size - 1 else None
            yield (ring.rank - hops) % ring.size, k, v       # shards move downstream: this one left hops ago
            if wait is not None:
                k, v = wait()

    def scores(self, q, k, mask):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return s if mask is None else s.masked_fill(~mask, float("-inf"))

    def fold(self, state, s, v):
        """Online softmax: fold one block of scores into a query half's (unnormalised out, row max, row sum)."""
        acc, m, l = state
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        fade, p = torch.exp(m - m_new), torch.exp(s - m_new)
        return acc * fade + p @ v, m_new, l * fade + p.sum(-1, keepdim=True)

    def forward(self, ring, q, k, v):
        c = q.shape[SEQ] // 2
        qs = q.split(c, SEQ)
        states = [(torch.zeros_like(h), h.new_full(h.shape[:-1] + (1,), float("-inf")),
                   h.new_zeros(h.shape[:-1] + (1,))) for h in qs]
        for source, k, v in self.around(ring, k, v):
            ks, vs = k.split(c, SEQ), v.split(c, SEQ)
            for a, b, mask in self.blocks(ring, source, c, q.device):
                states[a] = self.fold(states[a], self.scores(qs[a], ks[b], mask), vs[b])
        acc, m, l = (torch.cat(parts, SEQ) for parts in zip(*states))
        return acc / l, m + torch.log(l)

    def backward(self, ring, q, k, v, out, lse, dout):
        """P = exp(S - lse), recomputed per block.  dK, dV travel with their shard; one last hop takes them home."""
        delta = (dout * out).sum(-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for source, k, v in self.around(ring, k, v):
            self.add_block_grads(ring, source, (q, lse, dout, delta, dq), (k, v, dk, dv))
            if ring.size > 1:
                dk, dv = ring.hop(dk, dv)()
        return dq, dk, dv

    def add_block_grads(self, ring, source, queries, shard):
        """Add the gradients of every block of this rank's queries against ``source``'s K/V shard, in place:
        into dq (queries: q, lse, dout, delta, dq) and into the shard's dk, dv (shard: k, v, dk, dv)."""
        q = queries[0]
        c, scale = q.shape[SEQ] // 2, 1 / math.sqrt(q.shape[-1])
        qs, lses, douts, deltas, dqs = (t.split(c, SEQ) for t in queries)
        ks, vs, dks, dvs = (t.split(c, SEQ) for t in shard)
        for a, b, mask in self.blocks(ring, source, c, q.device):
            p = torch.exp(self.scores(qs[a], ks[b], mask) - lses[a])
            ds = p * (douts[a] @ vs[b].transpose(-1, -2) - deltas[a]) * scale
            dvs[b].add_(p.transpose(-1, -2) @ douts[a])
            dqs[a].add_(ds @ ks[b])
            dks[b].add_(ds.transpose(-1, -2) @ qs[a])


class _ZigzagFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, algorithm):
        ring = Ring(group)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = algorithm.forward(ring, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.algorithm = ring, algorithm
        return out

    @staticmethod
    def backward(ctx, dout):
        dq, dk, dv = ctx.algorithm.backward(ctx.ring, *ctx.saved_tensors, dout.contiguous())
        return dq, dk, dv, None, None


def zigzag_ring_attention(q, k, v, group=None):
    """Causal attention over the whole sequence; this rank holds (and gets back) its zigzag shard."""
    return ZigzagAttention()(q, k, v, group)
