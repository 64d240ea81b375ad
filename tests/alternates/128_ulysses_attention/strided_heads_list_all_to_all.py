"""A correct Ulysses / USP built differently from the reference at every turn the statement leaves free.

* Heads are dealt round-robin: rank j of the Ulysses group gets heads j, j + N, j + 2N, ... (not a block).
* The exchange is the list form, ``dist.all_to_all(outputs, inputs)``, of per-destination tensors.
* Only the raw exchange is an autograd node: as a map of the [N, ...] buffer it is a permutation that is its own
  inverse, so its backward is the same exchange; the layout moves around it are ordinary differentiable ops.
* Attention is written out (scores, an additive causal bias, softmax), and autograd differentiates it.
* USP's ring goes the other way round (K and V travel to the previous ring rank: after s hops ring rank i holds
  block i + s), and its backward takes dK, dV the same way home.
"""
import math

import torch
import torch.distributed as dist


class _Swap(torch.autograd.Function):
    """blocks[j] goes to rank j; what comes back, [N, ...], holds rank i's block at i.  Its own adjoint."""

    @staticmethod
    def forward(ctx, blocks, group):
        ctx.group = group
        return _swap(blocks, group)

    @staticmethod
    def backward(ctx, grad):
        return _swap(grad, ctx.group), None


def _swap(blocks, group):
    inputs = [b.contiguous() for b in blocks.unbind(0)]
    outputs = [torch.empty_like(b) for b in inputs]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.stack(outputs)


def _heads_of_sequence(x, n, group):
    """[..., H, c, D] -> [..., H/N, N c, D]; rank j keeps heads j::N."""
    *lead, h, c, d = x.shape
    blocks = x.reshape(*lead, h // n, n, c, d).movedim(-3, 0)          # blocks[j] = heads j::N
    got = _Swap.apply(blocks, group)                                   # got[i] = chunk i, my heads
    return got.movedim(0, -3).reshape(*lead, h // n, n * c, d)


def _sequence_of_heads(x, n, group):
    """[..., H/N, N c, D] -> [..., H, c, D]: the inverse of ``_heads_of_sequence``."""
    *lead, hn, s, d = x.shape
    blocks = x.reshape(*lead, hn, n, s // n, d).movedim(-3, 0)         # blocks[i] = chunk i of my heads
    got = _Swap.apply(blocks, group)                                   # got[j] = my chunk, heads j::N
    return got.movedim(0, -3).reshape(*lead, hn * n, s // n, d)        # head h*N + j


def _attention(q, k, v, causal):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s + torch.full((n, n), float("-inf"), dtype=s.dtype, device=s.device).triu(1)
    return torch.softmax(s, dim=-1) @ v


def _grid(q, k, v, causal, group, attend, what):
    n = dist.get_world_size(group)
    if q.shape[1] % n:
        raise ValueError(f"{what}: H = {q.shape[1]} is not a multiple of N = {n}")
    qkv = _heads_of_sequence(torch.stack([q, k, v]), n, group)
    return _sequence_of_heads(attend(*qkv.unbind(0), causal), n, group)


def ulysses_attention(q, k, v, causal=False, group=None):
    return _grid(q, k, v, causal, group, _attention, "ulysses_attention")


# ---- USP: a ring the other way round ------------------------------------------------------------------

def _neighbours(group):
    i, r = dist.get_rank(group), dist.get_world_size(group)
    return i, r, dist.get_global_rank(group, (i - 1) % r), dist.get_global_rank(group, (i + 1) % r)


def _hop(tensors, to, frm, group):
    arriving = [torch.empty_like(t) for t in tensors]
    works = [dist.isend(t.contiguous(), to, group=group) for t in tensors]
    works += [dist.irecv(a, frm, group=group) for a in arriving]
    return arriving, works


def _bias(i, j, c, causal, like):
    """0 where query block i may see key block j, -inf where not; None when all of it is hidden."""
    if not causal or j < i:
        return 0.0
    if j > i:
        return None
    return torch.full((c, c), float("-inf"), dtype=like.dtype, device=like.device).triu(1)


class _BackwardsRing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, group):
        i, r, to, frm = _neighbours(group)
        mine = (q, k, v)
        scale, c = 1 / math.sqrt(q.shape[-1]), q.shape[-2]
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)
        for step in range(r):
            if step < r - 1:
                (k2, v2), works = _hop((k, v), to, frm, group)
            bias = _bias(i, (i + step) % r, c, causal, q)
            if bias is not None:
                s = q @ k.transpose(-1, -2) * scale + bias
                block_lse = torch.logsumexp(s, -1, keepdim=True)
                new = torch.logaddexp(lse, block_lse)
                out = out * torch.exp(lse - new) + torch.exp(s - new) @ v
                lse = new
            if step < r - 1:
                for w in works:
                    w.wait()
                k, v = k2, v2
        ctx.save_for_backward(*mine, out, lse)
        ctx.causal, ctx.group = causal, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        i, r, to, frm = _neighbours(ctx.group)
        scale, c = 1 / math.sqrt(q.shape[-1]), q.shape[-2]
        delta = (dout * out).sum(-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for step in range(r):
            if step < r - 1:
                (k2, v2), works = _hop((k, v), to, frm, ctx.group)
            bias = _bias(i, (i + step) % r, c, ctx.causal, q)
            if bias is not None:
                p = torch.exp(q @ k.transpose(-1, -2) * scale + bias - lse)
                ds = p * (dout @ v.transpose(-1, -2) - delta) * scale
                dq = dq + ds @ k
                dk = dk + ds.transpose(-1, -2) @ q
                dv = dv + p.transpose(-1, -2) @ dout
            if r > 1:
                (dk, dv), grad_works = _hop((dk, dv), to, frm, ctx.group)
                for w in grad_works:
                    w.wait()
            if step < r - 1:
                for w in works:
                    w.wait()
                k, v = k2, v2
        return dq, dk, dv, None, None


def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    def ring(qh, kh, vh, is_causal):
        return _BackwardsRing.apply(qh.contiguous(), kh.contiguous(), vh.contiguous(), is_causal, ring_group)
    return _grid(q, k, v, causal, ulysses_group, ring, "usp_attention")
