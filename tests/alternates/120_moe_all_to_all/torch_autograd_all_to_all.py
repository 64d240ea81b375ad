"""A correct MoE layer that takes its differentiable all_to_all from torch: torch.distributed.nn.functional.

``all_to_all_single`` there is an autograd Function around dist.all_to_all_single whose backward sends the
gradient rows back with the split sizes swapped, which is exactly what the statement asks one to write.
The combine differs from the reference too: nothing is un-sorted; each weighted result is added onto the
token it came from (index_add over the sorted order) rather than reshaped to [T, top_k, d] and summed.

* Capacity: one expert at a time, its claims listed choice rank by choice rank (nonzero of each column of
  the top-k table, in token order); all but the first ``capacity`` are struck off.
* The load-balancing loss: its statistics are all-reduced in float64 whatever x's dtype, and the loss is
  written per token, E / (T * pairs) * sum_t probs[t] . counts: this rank's tokens' sum is the part with a
  gradient; the rest of the global value is added detached.
"""
import math
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_autograd
import torch.nn.functional as F


def _exchange(rows, out_splits, in_splits, group):
    out = rows.new_empty((sum(out_splits),) + tuple(rows.shape[1:]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # torch marks it deprecated in favour of the functional collectives
        return dist_autograd.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group=group)


def _struck_off(chosen, n_experts, capacity_factor):
    """[T * top_k] bool: the pairs past their expert's capacity."""
    tokens, top_k = chosen.shape
    struck = torch.zeros(tokens * top_k, dtype=torch.bool, device=chosen.device)
    if capacity_factor is None:
        return struck
    room = math.ceil(capacity_factor * tokens * top_k / n_experts)
    for e in range(n_experts):
        claims = torch.cat([(chosen[:, j] == e).nonzero().squeeze(1) * top_k + j for j in range(top_k)])
        struck[claims[room:]] = True
    return struck


def _aux_loss(logits, chosen, group):
    n_experts, top_k = logits.shape[1], chosen.shape[1]
    probs = torch.softmax(logits, dim=-1)
    counts = torch.bincount(chosen.reshape(-1), minlength=n_experts).double()
    stats = torch.cat([counts, probs.detach().double().sum(0)])
    dist.all_reduce(stats, group=group)
    pairs = float(stats[:n_experts].sum())
    if pairs == 0:
        return logits.new_zeros(())
    scale = n_experts / (pairs / top_k * pairs)
    counts = stats[:n_experts].to(probs.dtype)
    own = scale * (probs @ counts).sum()                                  # this rank's tokens, differentiable
    everyone = scale * float(stats[n_experts:] @ stats[:n_experts])
    return own + (everyone - own.detach())


def moe_forward(x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
    n, e_local = dist.get_world_size(group), w1.shape[0]
    tokens = x.shape[0]
    logits = x @ router_w
    top, chosen = logits.topk(top_k, dim=-1)
    weights = torch.softmax(top, dim=-1).reshape(-1)               # one weight per (token, choice)
    experts = chosen.reshape(-1)
    owner_token = torch.arange(tokens, device=x.device).repeat_interleave(top_k)
    going = (~_struck_off(chosen, n * e_local, capacity_factor)).nonzero().squeeze(1)
    order = going[torch.sort(experts[going], stable=True).indices]  # grouped by expert, so by owner rank
    per_expert = torch.bincount(experts[order], minlength=n * e_local)
    arriving = torch.empty_like(per_expert)
    dist.all_to_all_single(arriving, per_expert, group=group)      # 1. counts per global expert
    send = per_expert.view(n, e_local).sum(1).tolist()
    recv = arriving.view(n, e_local).sum(1).tolist()
    inbox = _exchange(x[owner_token[order]], recv, send, group)     # 2. dispatch
    expert_of_row = torch.arange(e_local, device=x.device).repeat(n).repeat_interleave(arriving)
    results = torch.zeros_like(inbox)
    for e in range(e_local):
        rows = (expert_of_row == e).nonzero().squeeze(1)
        results = results.index_copy(0, rows, F.gelu(inbox[rows] @ w1[e]) @ w2[e])
    back = _exchange(results, send, recv, group)                    # 3. combine
    weighted = back * weights[order].unsqueeze(-1)
    y = x.new_zeros(tokens, x.shape[1]).index_add(0, owner_token[order], weighted)
    if not return_stats:
        return y
    return y, _aux_loss(logits, chosen, group), tokens * top_k - len(order)
