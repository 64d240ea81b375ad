"""A correct MoE layer that runs its local experts as one padded batch, with no sort.

* Placement without argsort: each (token, choice) pair's slot in the send buffer is its expert's offset plus
  how many earlier pairs chose the same expert (a cumulative sum over a one-hot table), so rows are grouped
  by expert, hence by owner rank, in token order.
* The experts run together: the received rows are scattered into a zero-padded [E_local, most rows, d]
  tensor, pushed through torch.bmm with w1 and w2 at once, and gathered back; padding rows are dropped.
* The counts go out as an [N, E_local] table in x's dtype (exact for counts this small), row s to rank s.
"""
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


def _slots(experts, n_experts):
    """Where each (token, choice) pair goes in a buffer grouped by expert, token order kept within each."""
    one_hot = F.one_hot(experts, n_experts)
    before = torch.cumsum(one_hot, 0) - one_hot                  # earlier pairs with the same expert
    offsets = torch.cumsum(one_hot.sum(0), 0) - one_hot.sum(0)   # where each expert's block starts
    return (offsets.unsqueeze(0) + before).gather(1, experts.unsqueeze(1)).squeeze(1)


def _padded_experts(rows, local_expert, w1, w2):
    """Every row through its local expert: one bmm per layer over a zero-padded [E_local, most, d] batch."""
    e_local, d = w1.shape[0], rows.shape[1]
    counts = torch.bincount(local_expert, minlength=e_local)
    most = int(counts.max()) if rows.shape[0] else 0
    rank_in_expert = _slots(local_expert, e_local) - (torch.cumsum(counts, 0) - counts)[local_expert]
    padded = rows.new_zeros(e_local, most, d).index_put((local_expert, rank_in_expert), rows)
    out = torch.bmm(F.gelu(torch.bmm(padded, w1)), w2)
    return out[local_expert, rank_in_expert]


def moe_forward(x, router_w, w1, w2, top_k, group=None):
    n, e_local = dist.get_world_size(group), w1.shape[0]
    tokens, d = x.shape
    top, chosen = (x @ router_w).topk(top_k, dim=-1)
    weights, experts = torch.softmax(top, dim=-1), chosen.reshape(-1)
    slot = _slots(experts, n * e_local)
    table = torch.bincount(experts, minlength=n * e_local).view(n, e_local).to(x.dtype)
    incoming = torch.empty_like(table)
    dist.all_to_all_single(incoming, table, group=group)                       # 1. counts, row s for rank s
    send, recv = table.sum(1).long().tolist(), incoming.sum(1).long().tolist()
    outgoing = x.new_zeros(experts.numel(), d).index_put((slot,), x.repeat_interleave(top_k, 0))
    inbox = _Exchange.apply(outgoing, recv, send, group)                        # 2. dispatch
    local = torch.arange(e_local, device=x.device).repeat(n).repeat_interleave(incoming.reshape(-1).long())
    back = _Exchange.apply(_padded_experts(inbox, local, w1, w2), send, recv, group)   # 3. combine
    return (back[slot].view(tokens, top_k, d) * weights.unsqueeze(-1)).sum(1)
