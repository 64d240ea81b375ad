"""Divides by the global number of tokens without a guard: when no rank holds a token, the loss is 0 / 0 = NaN
instead of 0."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_ranks_without_tokens_with_capacity_and_aux"


class Unguarded(ref.MoE):
    def aux_loss(self, x, router_w, experts, group):
        n_experts, top_k = router_w.shape[1], experts.shape[1]
        probs = torch.softmax(x @ router_w, dim=-1)
        mine = probs.sum(0)
        stats = torch.cat([torch.bincount(experts.reshape(-1), minlength=n_experts).to(mine.dtype), mine.detach()])
        dist.all_reduce(stats, group=group)
        counts, prob_sums = stats[:n_experts], stats[n_experts:] + (mine - mine.detach())
        tokens = counts.sum() / top_k
        return n_experts * (counts / counts.sum() * prob_sums / tokens).sum()


moe_forward = Unguarded()
