"""A correct MoE layer that exchanges its token counts as a 2-D table through its own all_to_all helper.

The counts go out as a [N, E_local] table, row s to rank s, with no split sizes (every rank gets one row);
the tokens go through the same helper with split sizes.  Three all_to_all per forward, two mirrored ones in
backward: the tests must give it full marks.

* Capacity: one argsort of a composite key (expert, choice rank, token) lines every expert's claims up in
  claim order; a claim's place is its index minus where its expert's run starts.
* The load-balancing loss needs no collective of its own: with ``return_stats`` the table grows 2E columns,
  this rank's whole [counts of every choice | probability sums] in every row, so every rank receives every
  rank's statistics in the counts exchange and sums them.  The gradient goes through a surrogate:
  value + (surrogate - surrogate.detach()), the surrogate using this rank's probabilities only.
"""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


def all_to_all_rows(t, out_splits=None, in_splits=None, group=None):
    """Row blocks of ``t`` to each rank (even blocks without split sizes); the blocks received, stacked."""
    rows = t.shape[0] if out_splits is None else sum(out_splits)
    out = t.new_empty((rows,) + tuple(t.shape[1:]))
    dist.all_to_all_single(out, t.contiguous(), out_splits, in_splits, group=group)
    return out


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, out_splits, in_splits, group):
        ctx.save = (out_splits, in_splits, group)
        return all_to_all_rows(t, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits, group = ctx.save
        return all_to_all_rows(grad, in_splits, out_splits, group), None, None, None


def _fits(experts, n_experts, capacity_factor):
    """[T * top_k] bool, pair t * top_k + j at its place: whether it got one of its expert's slots."""
    tokens, top_k = experts.shape
    fits = torch.ones(tokens * top_k, dtype=torch.bool, device=experts.device)
    if capacity_factor is None or tokens == 0:
        return fits
    slots = math.ceil(capacity_factor * tokens * top_k / n_experts)
    j = torch.arange(top_k, device=experts.device).expand(tokens, top_k)
    t = torch.arange(tokens, device=experts.device).unsqueeze(1).expand(tokens, top_k)
    ranked = torch.argsort(((experts * top_k + j) * tokens + t).reshape(-1))   # by expert, choice rank, token
    flat = experts.reshape(-1)
    per_expert = torch.bincount(flat, minlength=n_experts)
    place = torch.empty_like(ranked)
    place[ranked] = torch.arange(len(ranked), device=experts.device) - (per_expert.cumsum(0) - per_expert)[flat[ranked]]
    return place < slots


def moe_forward(x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
    n, e_local = dist.get_world_size(group), w1.shape[0]
    n_experts, (tokens, d) = n * e_local, x.shape
    logits = x @ router_w
    top, experts = logits.topk(top_k, dim=-1)
    weights = torch.softmax(top, dim=-1)
    flat = experts.reshape(-1)
    kept = _fits(experts, n_experts, capacity_factor).nonzero().squeeze(1)
    order = kept[torch.argsort(flat[kept], stable=True)]
    table = torch.bincount(flat[order], minlength=n_experts).view(n, e_local)   # row s: what goes to rank s
    if return_stats:
        probs = torch.softmax(logits, dim=-1)
        mine = probs.sum(0)
        stats = torch.cat([torch.bincount(flat, minlength=n_experts).to(x.dtype), mine.detach()])
        wide = all_to_all_rows(torch.cat([table.to(x.dtype), stats.expand(n, -1)], 1), group=group)
        incoming_table, everyone = wide[:, :e_local].round().long(), wide[:, e_local:].sum(0)
    else:
        incoming_table = all_to_all_rows(table, group=group)                   # row s: what rank s sends here
    send_splits, recv_splits = table.sum(1).tolist(), incoming_table.sum(1).tolist()
    rows = _Exchange.apply(x[order // top_k], recv_splits, send_splits, group)
    local = torch.arange(e_local, device=x.device).repeat(n).repeat_interleave(incoming_table.reshape(-1))
    results = torch.zeros_like(rows)
    for e in range(e_local):
        picked = (local == e).nonzero().squeeze(1)
        results = results.index_copy(0, picked, F.gelu(rows[picked] @ w1[e]) @ w2[e])
    back = _Exchange.apply(results, send_splits, recv_splits, group)
    per_choice = back.new_zeros(tokens * top_k, d).index_copy(0, order, back)   # undo the sort; dropped stay 0
    y = (per_choice.view(tokens, top_k, d) * weights.unsqueeze(-1)).sum(1)
    if not return_stats:
        return y
    counts, prob_sums = everyone[:n_experts], everyone[n_experts:]
    pairs = float(counts.sum())
    if pairs == 0:
        return y, x.new_zeros(()), 0
    scale = n_experts * counts / (pairs * pairs / top_k)
    value, surrogate = (scale * prob_sums).sum(), (scale * mine).sum()
    return y, value + (surrogate - surrogate.detach()), tokens * top_k - len(order)
