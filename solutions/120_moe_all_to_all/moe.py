"""Problem 120 reference: mixture-of-experts layer with expert parallelism over all-to-all.

Each token picks its top-k experts; every (token, choice) pair travels to the rank
that owns the expert, is transformed there, and comes back to be weighted and summed.
With a capacity factor, each expert takes at most ``capacity`` pairs from each rank; the
rest are dropped before the dispatch (they add nothing: the residual around the layer
carries those tokens).  With ``return_stats``, Switch's load-balancing loss over the
global batch comes back too, from one all_reduce of the ranks' routing statistics.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


def all_to_all(x, out_splits, in_splits, group):
    """Row block i of ``x`` (in_splits[i] rows) goes to group rank i; blocks arrive stacked by source rank."""
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class AllToAll(torch.autograd.Function):
    """all_to_all along dim 0, differentiable: its backward sends the gradients back the way the rows came."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return all_to_all(grad, in_splits, out_splits, ctx.group), None, None, None


class MoE:
    """The algorithm, one overridable piece per method."""

    def __call__(self, x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
        size, e_local = dist.get_world_size(group), w1.shape[0]
        tokens, d = x.shape
        weights, experts = self.route(x, router_w, top_k)
        choices = experts.reshape(-1)                   # token t's j-th choice sits at t * top_k + j
        kept = self.kept(experts, size * e_local, capacity_factor)        # the pairs that fit their expert
        order = kept[torch.argsort(choices[kept], stable=True)]  # grouped by expert, hence by the rank that owns it
        send_counts = torch.bincount(choices[order], minlength=size * e_local)
        recv_counts = self.exchange_counts(send_counts, group)                  # 1. how many, per expert
        send_splits = self.rank_splits(send_counts, size, e_local)
        recv_splits = self.rank_splits(recv_counts, size, e_local)
        outgoing = x[order // top_k]
        incoming = self.exchange(outgoing, recv_splits, send_splits, group)      # 2. dispatch
        results = self.run_experts(incoming, recv_counts, w1, w2)
        returned = self.exchange(results, send_splits, recv_splits, group)       # 3. combine
        y = self.combine(returned, order, weights, tokens, top_k, d)
        if not return_stats:
            return y
        return y, self.aux_loss(x, router_w, experts, group), tokens * top_k - len(order)

    def exchange_counts(self, send_counts, group):
        """recv_counts[s * E_local + e]: how many token choices rank s sends to this rank's expert e."""
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)
        return recv_counts

    def exchange(self, rows, out_splits, in_splits, group):
        return AllToAll.apply(rows, out_splits, in_splits, group)

    def route(self, x, router_w, top_k):
        """Each token's top-k experts (ties as torch.topk breaks them) and their softmax weights."""
        top, experts = (x @ router_w).topk(top_k, dim=-1)
        return torch.softmax(top, dim=-1), experts

    def kept(self, experts, n_experts, capacity_factor):
        """Flat indices t * top_k + j, ascending, of the pairs that get a slot of their expert.

        capacity = ceil(capacity_factor * T_r * top_k / E) slots per expert for this rank's tokens.  Claims go
        choice rank by choice rank (every token's first choice, then every token's second), and by token index
        within one choice rank."""
        tokens, top_k = experts.shape
        every_pair = torch.arange(tokens * top_k, device=experts.device)
        if capacity_factor is None:
            return every_pair
        capacity = math.ceil(capacity_factor * tokens * top_k / n_experts)
        claims = F.one_hot(experts.t().reshape(-1), n_experts)          # row j * T_r + t: pair (t, j)'s expert
        earlier = ((claims.cumsum(0) - 1) * claims).sum(1)              # claims on that expert before this one
        fits = (earlier < capacity).view(top_k, tokens).t().reshape(-1)  # back to t * top_k + j
        return every_pair[fits]

    def rank_splits(self, per_expert, size, e_local) -> list:
        """Per-expert counts -> per-rank counts: global expert e lives on rank e // e_local."""
        return per_expert.view(size, e_local).sum(1).tolist()

    def expert(self, h, w1, w2):
        return F.gelu(h @ w1) @ w2

    def run_experts(self, incoming, recv_counts, w1, w2):
        """Rows arrive grouped by source rank, then by local expert; run each row through its expert."""
        e_local = w1.shape[0]
        local_expert = torch.arange(e_local, device=incoming.device).repeat(len(recv_counts) // e_local).repeat_interleave(recv_counts)
        out = torch.zeros_like(incoming)
        for e in range(e_local):
            rows = (local_expert == e).nonzero().squeeze(1)
            out = out.index_copy(0, rows, self.expert(incoming[rows], w1[e], w2[e]))
        return out

    def combine(self, returned, order, weights, tokens, top_k, d):
        """Each result back at its pair's place (a dropped pair's stays 0); y[t] = sum_j weights[t, j] * result."""
        per_pair = returned.new_zeros(tokens * top_k, d).index_copy(0, order, returned)
        return (per_pair.view(tokens, top_k, d) * weights.unsqueeze(-1)).sum(1)

    def aux_loss(self, x, router_w, experts, group):
        """Switch's load-balancing loss over the global batch: E * sum_e f_e * P_e.

        f_e: the fraction of all ranks' (token, choice) pairs that chose e, dropped ones included; P_e: the mean
        over all ranks' tokens of softmax(x @ router_w)[e].  One all_reduce sums each rank's [counts | probability
        sums]; the value is the global one on every rank, its gradient this rank's own tokens' part (f_e has none)."""
        n_experts, top_k = router_w.shape[1], experts.shape[1]
        probs = torch.softmax(x @ router_w, dim=-1)
        mine = probs.sum(0)
        stats = torch.cat([torch.bincount(experts.reshape(-1), minlength=n_experts).to(mine.dtype), mine.detach()])
        dist.all_reduce(stats, group=group)                                  # 4. the global statistics
        counts, prob_sums = stats[:n_experts], stats[n_experts:]
        pairs = float(counts.sum())
        if pairs == 0:                                                       # no token on any rank
            return x.new_zeros(())
        prob_sums = prob_sums + (mine - mine.detach())                       # everyone's value, my gradient
        return n_experts * (counts / pairs * prob_sums / (pairs / top_k)).sum()


def moe_forward(x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
    return MoE()(x, router_w, w1, w2, top_k, group, capacity_factor, return_stats)
