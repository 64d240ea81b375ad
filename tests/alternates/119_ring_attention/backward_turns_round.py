"""A correct ring attention whose backward goes round the ring the other way from its forward.

Forward K/V chunks travel to the next rank (after s hops rank r holds chunk r - s); in backward K, V and the
dK/dV accumulators travel to the previous rank (after s hops rank r holds chunk r + s), and the last hop takes
each accumulator home.  The statement asks only the forward to go one way; backward may talk to either
neighbour.  The ring is one generator for both passes, and the causal mask is an additive bias (0 or -inf).
"""
import math

import torch
import torch.distributed as dist


def _seats(group):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    seat = (lambda i: i % size) if group is None else (lambda i: dist.get_global_rank(group, i % size))
    return rank, size, seat


def _round_the_ring(tensors, towards, group):
    """Yield (hops, the tensors held) N times; between yields they move one hop ``towards`` (+1: the next rank,
    -1: the previous one), each hop posted before the caller computes with what it holds and waited for after."""
    rank, size, seat = _seats(group)
    held = list(tensors)
    for hops in range(size):
        works, arriving = [], []
        if hops < size - 1:
            arriving = [torch.empty_like(t) for t in held]
            works = [dist.isend(t, seat(rank + towards), group=group) for t in held]
            works += [dist.irecv(a, seat(rank - towards), group=group) for a in arriving]
        yield hops, held
        for work in works:
            work.wait()
        held = arriving


def _block(q_chunk, k_chunk, c, causal, like):
    """(needed, bias): whether any query of the block may see a key (global positions), and the additive bias,
    0 where it may and -inf where it may not (None when it sees every key)."""
    if not causal or k_chunk < q_chunk:
        return True, None
    pos = torch.arange(c, device=like.device)
    visible = q_chunk * c + pos[:, None] >= k_chunk * c + pos[None, :]
    return bool(visible.any()), torch.where(visible, 0.0, float("-inf")).to(like.dtype)


def _scores(q, k, bias):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return s if bias is None else s + bias


class _TurnsRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, group):
        rank, size, _ = _seats(group)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        c = q.shape[-2]
        state = {"m": q.new_full(q.shape[:-1] + (1,), float("-inf")), "l": q.new_zeros(q.shape[:-1] + (1,)),
                 "acc": torch.zeros_like(q)}
        for hops, (kj, vj) in _round_the_ring((k, v), +1, group):
            needed, bias = _block(rank, (rank - hops) % size, c, causal, q)
            if not needed:
                continue
            s = _scores(q, kj, bias)
            m = torch.maximum(state["m"], s.amax(-1, keepdim=True))
            p, fade = torch.exp(s - m), torch.exp(state["m"] - m)
            state = {"m": m, "l": state["l"] * fade + p.sum(-1, keepdim=True), "acc": state["acc"] * fade + p @ vj}
        out = state["acc"] / state["l"]
        ctx.save_for_backward(q, k, v, out, state["m"] + torch.log(state["l"]))
        ctx.causal, ctx.group = causal, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        rank, size, seat = _seats(ctx.group)
        dout, c = dout.contiguous(), q.shape[-2]
        delta = (dout * out).sum(-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for hops, (kj, vj) in _round_the_ring((k, v), -1, ctx.group):
            needed, bias = _block(rank, (rank + hops) % size, c, ctx.causal, q)
            if needed:
                p = torch.exp(_scores(q, kj, bias) - lse)
                ds = p * (dout @ vj.transpose(-1, -2) - delta) / math.sqrt(q.shape[-1])
                dq, dk, dv = dq + ds @ kj, dk + ds.transpose(-1, -2) @ q, dv + p.transpose(-1, -2) @ dout
            if size > 1:    # the accumulators follow their chunk to the previous rank; the last hop takes them home
                arriving = [torch.empty_like(dk), torch.empty_like(dv)]
                works = [dist.isend(t, seat(rank - 1), group=ctx.group) for t in (dk, dv)]
                works += [dist.irecv(a, seat(rank + 1), group=ctx.group) for a in arriving]
                for work in works:
                    work.wait()
                dk, dv = arriving
        return dq, dk, dv, None, None


def ring_attention(q, k, v, causal=False, group=None):
    return _TurnsRound.apply(q, k, v, causal, group)
