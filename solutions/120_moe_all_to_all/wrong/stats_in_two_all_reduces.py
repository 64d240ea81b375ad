"""Sums the counts and the probability sums in two all_reduces, one each: the loss is right, but the statistics
cost two collectives where one (or none, in the counts exchange) is allowed."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_aux_loss_costs_one_small_all_reduce"


class TwoReductions(ref.MoE):
    def aux_loss(self, x, router_w, experts, group):
        n_experts, top_k = router_w.shape[1], experts.shape[1]
        probs = torch.softmax(x @ router_w, dim=-1)
        mine = probs.sum(0)
        counts = torch.bincount(experts.reshape(-1), minlength=n_experts).to(mine.dtype)
        prob_sums = mine.detach().clone()
        dist.all_reduce(counts, group=group)
        dist.all_reduce(prob_sums, group=group)
        pairs = float(counts.sum())
        if pairs == 0:
            return x.new_zeros(())
        return n_experts * (counts / pairs * (prob_sums + mine - mine.detach()) / (pairs / top_k)).sum()


moe_forward = TwoReductions()
