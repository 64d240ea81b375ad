"""A correct zigzag ring attention whose backward goes round the ring the other way from its forward.

* Forward K/V shards go downstream (after s hops rank r holds shard r - s); in backward K, V and the dK/dV
  accumulators go upstream (after s hops rank r holds shard r + s), and the last hop takes them home.  Only
  the forward must go one way; backward may use either neighbour.
* Blocks are chosen from chunk numbers alone, the statement's table (key chunk j before query chunk i: whole;
  j = i: under the triangle; after: skipped), with no position tensors; matmuls are written as einsum.
* The zigzag layout is an index_select of the two chunks' positions.
"""
import math

import torch
import torch.distributed as dist


def zigzag_shard(x, rank, world):
    s = x.shape[2]
    if s % (2 * world) or not 0 <= rank < world:
        raise ValueError(f"zigzag_shard(rank={rank}, world={world}): needs 0 <= rank < world and 2N = {2 * world} "
                         f"dividing S = {s}")
    c = s // (2 * world)
    picked = torch.cat([torch.arange(i * c, (i + 1) * c, device=x.device) for i in (rank, 2 * world - 1 - rank)])
    return x.index_select(2, picked)


def _chunks(rank, n):
    return rank, 2 * n - 1 - rank


def _plan(rank, source, n):
    """[(query half a, key half b, diagonal?)] for the blocks this rank computes against ``source``'s shard."""
    return [(a, b, i == j) for a, i in enumerate(_chunks(rank, n)) for b, j in enumerate(_chunks(source, n))
            if j <= i]


def _logits(q, k, diagonal):
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if diagonal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


class _Ring:
    def __init__(self, group):
        self.group, self.rank, self.n = group, dist.get_rank(group), dist.get_world_size(group)
        self.seat = (lambda i: i % self.n) if group is None else (lambda i: dist.get_global_rank(group, i % self.n))

    def post(self, tensors, towards):
        """isend each tensor one hop ``towards`` (+1 downstream, -1 upstream); irecv as many from the other side."""
        coming = [torch.empty_like(t) for t in tensors]
        works = [dist.isend(t, self.seat(self.rank + towards), group=self.group) for t in tensors]
        works += [dist.irecv(c, self.seat(self.rank - towards), group=self.group) for c in coming]
        return coming, works


def _wait(works):
    for work in works:
        work.wait()


class _TurnsRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group):
        ring = _Ring(group)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        c = q.shape[2] // 2
        halves = q.split(c, 2)
        state = {a: [torch.zeros_like(h), h.new_full(h.shape[:-1] + (1,), float("-inf")),
                     h.new_zeros(h.shape[:-1] + (1,))] for a, h in enumerate(halves)}
        held_k, held_v = k, v
        for hops in range(ring.n):
            coming, works = ring.post([held_k, held_v], +1) if hops < ring.n - 1 else (None, [])
            for a, b, diagonal in _plan(ring.rank, (ring.rank - hops) % ring.n, ring.n):
                acc, m, l = state[a]
                s = _logits(halves[a], held_k.split(c, 2)[b], diagonal)
                top = torch.maximum(m, s.amax(-1, keepdim=True))
                p, fade = torch.exp(s - top), torch.exp(m - top)
                state[a] = [acc * fade + torch.einsum("bhqk,bhkd->bhqd", p, held_v.split(c, 2)[b]), top,
                            l * fade + p.sum(-1, keepdim=True)]
            _wait(works)
            if coming:
                held_k, held_v = coming
        out = torch.cat([state[a][0] / state[a][2] for a in (0, 1)], 2)
        lse = torch.cat([state[a][1] + torch.log(state[a][2]) for a in (0, 1)], 2)
        ctx.ring = ring
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        ring, (q, k, v, out, lse) = ctx.ring, ctx.saved_tensors
        c, scale = q.shape[2] // 2, 1 / math.sqrt(q.shape[-1])
        dout = dout.contiguous()
        delta = torch.einsum("bhsd,bhsd->bhs", dout, out).unsqueeze(-1)
        split = [t.split(c, 2) for t in (q, dout, lse, delta)]
        dq, dk, dv = [torch.zeros_like(q[:, :, :c]) for _ in range(2)], torch.zeros_like(k), torch.zeros_like(v)
        for hops in range(ring.n):
            coming, works = ring.post([k, v], -1) if hops < ring.n - 1 else (None, [])
            dks, dvs = list(dk.split(c, 2)), list(dv.split(c, 2))
            for a, b, diagonal in _plan(ring.rank, (ring.rank + hops) % ring.n, ring.n):
                qa, da, la, ea = (t[a] for t in split)
                kb, vb = k.split(c, 2)[b], v.split(c, 2)[b]
                p = torch.exp(_logits(qa, kb, diagonal) - la)
                ds = p * (torch.einsum("bhqd,bhkd->bhqk", da, vb) - ea) * scale
                dvs[b] = dvs[b] + torch.einsum("bhqk,bhqd->bhkd", p, da)
                dks[b] = dks[b] + torch.einsum("bhqk,bhqd->bhkd", ds, qa)
                dq[a] = dq[a] + torch.einsum("bhqk,bhkd->bhqd", ds, kb)
            dk, dv = torch.cat(dks, 2), torch.cat(dvs, 2)
            if ring.n > 1:     # the accumulators follow their shard upstream; the last hop takes them home
                (dk, dv), grad_works = ring.post([dk, dv], -1)
                _wait(grad_works)
            _wait(works)
            if coming:
                k, v = coming
        return torch.cat(dq, 2), dk, dv, None


def zigzag_ring_attention(q, k, v, group=None):
    return _TurnsRound.apply(q, k, v, group)
