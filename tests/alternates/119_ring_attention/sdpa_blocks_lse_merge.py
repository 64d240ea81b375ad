"""A correct ring attention built from torch's own pieces, with no running max or running sum.

* Forward: each block is torch's F.scaled_dot_product_attention (is_causal on the diagonal block) plus the
  block's log-sum-exp; the blocks merge by their log-sum-exps (flash-attention's ring form): the running
  output stays normalised, out = e^(lse - new) out + e^(lse_j - new) out_j with new = logaddexp(lse, lse_j).
* Backward: each block's gradients come from torch.autograd.grad of a surrogate scalar,
  sum(dO * P_j V_j) - sum(D * rowsum P_j) with P_j = exp(S_j - lse) and lse, D held constant, whose gradient
  with respect to S_j is P_j (dP - D): autograd writes the block formulas, not this file.
"""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


class _Ring:
    def __init__(self, group):
        self.group, self.rank, self.size = group, dist.get_rank(group), dist.get_world_size(group)
        seat = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
        self.next, self.prev = seat((self.rank + 1) % self.size), seat((self.rank - 1) % self.size)

    def post(self, *tensors):
        """isend each tensor to the next rank, irecv one like it from the previous; wait() gives what came."""
        arriving = [torch.empty_like(t) for t in tensors]
        works = [dist.isend(t, self.next, group=self.group) for t in tensors]
        works += [dist.irecv(a, self.prev, group=self.group) for a in arriving]

        def wait():
            for work in works:
                work.wait()
            return arriving
        return wait


def _kind(q_chunk, k_chunk, causal):
    """'all', 'diagonal' or None (nothing visible) for the block (this query chunk, that key chunk)."""
    if not causal or k_chunk < q_chunk:
        return "all"
    return "diagonal" if k_chunk == q_chunk else None


def _scores(q, k, kind):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if kind == "diagonal":
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


def _forward(ring, q, k, v, causal):
    out, lse = torch.zeros_like(q), q.new_full(q.shape[:-1] + (1,), float("-inf"))
    for step in range(ring.size):
        wait = ring.post(k, v) if step < ring.size - 1 else None
        kind = _kind(ring.rank, (ring.rank - step) % ring.size, causal)
        if kind:
            block_out = F.scaled_dot_product_attention(q, k, v, is_causal=kind == "diagonal")
            block_lse = torch.logsumexp(_scores(q, k, kind), -1, keepdim=True)
            merged = torch.logaddexp(lse, block_lse)
            out = torch.exp(lse - merged) * out + torch.exp(block_lse - merged) * block_out
            lse = merged
        if wait:
            k, v = wait()
    return out, lse


def _block_grads(q, k, v, kind, lse, dout, delta):
    """(dq, dk, dv) of one block, by autograd on the surrogate whose S-gradient is P (dO V^T - D)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        p = torch.exp(_scores(q, k, kind) - lse)
        surrogate = (dout * (p @ v)).sum() - (delta * p.sum(-1, keepdim=True)).sum()
        return torch.autograd.grad(surrogate, (q, k, v))


class _SdpaRing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, group):
        ring = _Ring(group)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = _forward(ring, q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal = ring, causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, dout = ctx.ring, dout.contiguous()
        delta = (dout * out).sum(-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for step in range(ring.size):
            wait = ring.post(k, v) if step < ring.size - 1 else None
            kind = _kind(ring.rank, (ring.rank - step) % ring.size, ctx.causal)
            if kind:
                grads = _block_grads(q, k, v, kind, lse, dout, delta)
                dq, dk, dv = dq + grads[0], dk + grads[1], dv + grads[2]
            if ring.size > 1:           # the accumulators go on with their chunk; the last hop takes them home
                dk, dv = ring.post(dk, dv)()
            if wait:
                k, v = wait()
        return dq, dk, dv, None, None


def ring_attention(q, k, v, causal=False, group=None):
    return _SdpaRing.apply(q, k, v, causal, group)
