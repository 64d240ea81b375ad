"""A correct MoE layer that runs its local experts as one padded batch, with no sort.

* Placement without argsort: each (token, choice) pair's slot in the send buffer is its expert's offset plus
  how many earlier pairs chose the same expert (a cumulative sum over a one-hot table), so rows are grouped
  by expert, hence by owner rank, in token order.
* The experts run together: the received rows are scattered into a zero-padded [E_local, most rows, d]
  tensor, pushed through torch.bmm with w1 and w2 at once, and gathered back; padding rows are dropped.
* The counts go out as an [N, E_local] table in x's dtype (exact for counts this small), row s to rank s.
* Capacity: the same one-hot cumulative sum, taken in claim order (all first choices, then all second ones),
  says how many claims on its expert came before each pair's.
* The load-balancing loss: one all_reduce of [counts | probability sums | tokens] (2E + 1 numbers) through an
  autograd Function whose backward passes the gradient through unchanged: each rank keeps its own part.
"""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, out_splits, in_splits, group):
        ctx.splits, ctx.group = (in_splits, out_splits), group
        out = rows.new_empty((sum(out_splits),) + tuple(rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        back_out, back_in = ctx.splits
        out = grad.new_empty((sum(back_out),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), back_out, back_in, group=ctx.group)
        return out, None, None, None


class _SumKeepingMyGradient(torch.autograd.Function):
    """The sum over ranks forward; backward hands this rank's gradient to this rank's own statistics, as is."""

    @staticmethod
    def forward(ctx, stats, group):
        total = stats.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _before(experts, n_experts):
    """For each pair, in the given order: how many earlier pairs chose the same expert."""
    one_hot = F.one_hot(experts, n_experts)
    return (torch.cumsum(one_hot, 0) - one_hot).gather(1, experts.unsqueeze(1)).squeeze(1)


def _slots(experts, n_experts):
    """Where each (token, choice) pair goes in a buffer grouped by expert, token order kept within each."""
    per_expert = torch.bincount(experts, minlength=n_experts)
    return (torch.cumsum(per_expert, 0) - per_expert)[experts] + _before(experts, n_experts)


def _padded_experts(rows, local_expert, w1, w2):
    """Every row through its local expert: one bmm per layer over a zero-padded [E_local, most, d] batch."""
    e_local, d = w1.shape[0], rows.shape[1]
    counts = torch.bincount(local_expert, minlength=e_local)
    most = int(counts.max()) if rows.shape[0] else 0
    rank_in_expert = _slots(local_expert, e_local) - (torch.cumsum(counts, 0) - counts)[local_expert]
    padded = rows.new_zeros(e_local, most, d).index_put((local_expert, rank_in_expert), rows)
    out = torch.bmm(F.gelu(torch.bmm(padded, w1)), w2)
    return out[local_expert, rank_in_expert]


def _aux_loss(logits, chosen, group):
    n_experts, (tokens, top_k) = logits.shape[1], chosen.shape
    probs = torch.softmax(logits, dim=-1)
    counts = torch.bincount(chosen.reshape(-1), minlength=n_experts).to(probs.dtype)
    stats = torch.cat([counts, probs.sum(0), probs.new_tensor([tokens])])
    total = _SumKeepingMyGradient.apply(stats, group)
    everyone = float(total[-1].detach())
    if everyone == 0:
        return logits.new_zeros(())
    f, p = total[:n_experts].detach() / (everyone * top_k), total[n_experts:-1] / everyone
    return n_experts * (f * p).sum()


def moe_forward(x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
    n, e_local = dist.get_world_size(group), w1.shape[0]
    tokens, d = x.shape
    logits = x @ router_w
    top, chosen = logits.topk(top_k, dim=-1)
    weights, experts = torch.softmax(top, dim=-1), chosen.reshape(-1)
    keep = torch.ones_like(experts, dtype=torch.bool)
    if capacity_factor is not None:
        room = math.ceil(capacity_factor * tokens * top_k / (n * e_local))
        keep = (_before(chosen.t().reshape(-1), n * e_local) < room).view(top_k, tokens).t().reshape(-1)
    kept = keep.nonzero().squeeze(1)                                            # pairs t * top_k + j that go
    slot = _slots(experts[kept], n * e_local)
    table = torch.bincount(experts[kept], minlength=n * e_local).view(n, e_local).to(x.dtype)
    incoming = torch.empty_like(table)
    dist.all_to_all_single(incoming, table, group=group)                       # 1. counts, row s for rank s
    send, recv = table.sum(1).long().tolist(), incoming.sum(1).long().tolist()
    outgoing = x.new_zeros(len(kept), d).index_put((slot,), x[kept // top_k])
    inbox = _Exchange.apply(outgoing, recv, send, group)                        # 2. dispatch
    local = torch.arange(e_local, device=x.device).repeat(n).repeat_interleave(incoming.reshape(-1).long())
    back = _Exchange.apply(_padded_experts(inbox, local, w1, w2), send, recv, group)   # 3. combine
    per_pair = x.new_zeros(tokens * top_k, d).index_put((kept,), back[slot])
    y = (per_pair.view(tokens, top_k, d) * weights.unsqueeze(-1)).sum(1)
    if not return_stats:
        return y
    return y, _aux_loss(logits, chosen, group), tokens * top_k - len(kept)
