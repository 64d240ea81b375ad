"""A correct MoE layer that exchanges its token counts as a 2-D table through its own all_to_all helper.

The counts go out as a [N, E_local] table, row s to rank s, with no split sizes (every rank gets one row);
the tokens go through the same helper with split sizes.  Three all_to_all per forward, two mirrored ones in
backward: the tests must give it full marks.
"""
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


def moe_forward(x, router_w, w1, w2, top_k, group=None):
    n, e_local = dist.get_world_size(group), w1.shape[0]
    logits = x @ router_w
    top, experts = logits.topk(top_k, dim=-1)
    weights = torch.softmax(top, dim=-1)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    table = torch.bincount(flat, minlength=n * e_local).view(n, e_local)   # row s: what goes to rank s
    incoming_table = all_to_all_rows(table, group=group)                   # row s: what rank s sends here
    send_splits, recv_splits = table.sum(1).tolist(), incoming_table.sum(1).tolist()
    rows = _Exchange.apply(x[order // top_k], recv_splits, send_splits, group)
    local = torch.arange(e_local, device=x.device).repeat(n).repeat_interleave(incoming_table.reshape(-1))
    results = torch.zeros_like(rows)
    for e in range(e_local):
        picked = (local == e).nonzero().squeeze(1)
        results = results.index_copy(0, picked, F.gelu(rows[picked] @ w1[e]) @ w2[e])
    back = _Exchange.apply(results, send_splits, recv_splits, group)
    per_choice = torch.empty_like(back).index_copy(0, order, back)           # undo the sort
    return (per_choice.view(x.shape[0], top_k, x.shape[1]) * weights.unsqueeze(-1)).sum(1)
