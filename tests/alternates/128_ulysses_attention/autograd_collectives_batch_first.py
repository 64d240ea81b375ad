"""A correct Ulysses / USP with no autograd Function for the exchanges, a batch-first packing, and a ring whose
backward goes round the other way.

* The exchanges are ``torch.distributed.nn.functional.all_to_all_single``, torch's differentiable all_to_all: its
  backward is the mirrored all_to_all, so this file writes no backward for them.
* q, k, v are packed batch first, [B, 3, H, c, D], then cut by destination (dim 0 after the move); the output
  goes back as [B, H/N, S, D] cut along the sequence.
* USP's ring: forward as 119's (K, V to the next ring rank), each block is ``F.scaled_dot_product_attention``
  merged with the others by their log-sum-exps; backward sends K, V and the dK, dV accumulators to the
  PREVIOUS ring rank, and recomputes each block's probabilities from the saved log-sum-exp.
"""
import math

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import torch.nn.functional as F


def _exchange(send, group):
    """send: [N, ...] with block j for rank j; returns [N, ...] with rank i's block at i.  Differentiable."""
    return dnn.all_to_all_single(torch.empty_like(send), send, group=group)


def _ulysses(q, k, v, causal, group, attend, what):
    n = dist.get_world_size(group)
    b, h, c, d = q.shape
    if h % n:
        raise ValueError(f"{what}: the {h} heads do not divide among {n} ranks")
    packed = torch.stack([q, k, v], dim=1).reshape(b, 3, n, h // n, c, d).movedim(2, 0).contiguous()
    got = _exchange(packed, group)                                        # [N(source), B, 3, H/N, c, D]
    qh, kh, vh = got.permute(2, 1, 3, 0, 4, 5).reshape(3, b, h // n, n * c, d).unbind(0)
    out = attend(qh, kh, vh, causal)                                      # [B, H/N, S, D]
    back = out.reshape(b, h // n, n, c, d).movedim(2, 0).contiguous()     # [N(destination), B, H/N, c, D]
    return _exchange(back, group).movedim(0, 1).reshape(b, h, c, d)      # rank i's heads come from rank i


def ulysses_attention(q, k, v, causal=False, group=None):
    def attend(qh, kh, vh, is_causal):
        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=is_causal)
    return _ulysses(q, k, v, causal, group, attend, "ulysses_attention")


# ---- USP's ring ------------------------------------------------------------------------------------------

class _Ring:
    def __init__(self, group):
        self.group, self.i, self.r = group, dist.get_rank(group), dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.i + 1) % self.r)
        self.prev = dist.get_global_rank(group, (self.i - 1) % self.r)

    def post(self, tensors, to, frm):
        arriving = [torch.empty_like(t) for t in tensors]
        works = [dist.isend(t, to, group=self.group) for t in tensors]
        works += [dist.irecv(a, frm, group=self.group) for a in arriving]

        def wait():
            for w in works:
                w.wait()
            return arriving
        return wait


def _visible(i, j, causal):
    """'all', 'diagonal' or None for query block i against key block j."""
    if not causal or j < i:
        return "all"
    return "diagonal" if j == i else None


def _scores(q, k, kind):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if kind == "diagonal":
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


class _TurningRing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, group):
        ring = _Ring(group)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        held = (k, v)
        out, lse = None, None
        for step in range(ring.r):
            wait = ring.post(held, ring.next, ring.prev) if step < ring.r - 1 else None
            kind = _visible(ring.i, (ring.i - step) % ring.r, causal)
            if kind:
                block = F.scaled_dot_product_attention(q, held[0], held[1], is_causal=kind == "diagonal")
                block_lse = torch.logsumexp(_scores(q, held[0], kind), -1, keepdim=True)
                if out is None:
                    out, lse = block, block_lse
                else:
                    new = torch.logaddexp(lse, block_lse)
                    out, lse = out * torch.exp(lse - new) + block * torch.exp(block_lse - new), new
            if wait:
                held = tuple(wait())
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.group = causal, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, dout = _Ring(ctx.group), dout.contiguous()
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(q)
        held, grads = (k, v), (torch.zeros_like(k), torch.zeros_like(v))
        for step in range(ring.r):       # backwards round: after s hops this rank holds block i + s
            wait = ring.post(held, ring.prev, ring.next) if step < ring.r - 1 else None
            kind = _visible(ring.i, (ring.i + step) % ring.r, ctx.causal)
            if kind:
                kh, vh = held
                p = torch.exp(_scores(q, kh, kind) - lse)
                ds = p * (dout @ vh.transpose(-1, -2) - delta) / math.sqrt(q.shape[-1])
                dq = dq + ds @ kh
                grads = (grads[0] + ds.transpose(-1, -2) @ q, grads[1] + p.transpose(-1, -2) @ dout)
            if ring.r > 1:                # the accumulators travel with their block; the last hop takes them home
                grads = tuple(ring.post(grads, ring.prev, ring.next)())
            if wait:
                held = tuple(wait())
        return dq, grads[0], grads[1], None, None


def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    def attend(qh, kh, vh, is_causal):
        return _TurningRing.apply(qh, kh, vh, is_causal, ring_group)
    return _ulysses(q, k, v, causal, ulysses_group, attend, "usp_attention")
