"""Detaches the routing statistics so that dist.all_reduce can sum them, and builds the loss from the sums: the
value is right, but no gradient reaches router_w or x."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_aux_loss_gradient"


class Detached(ref.MoE):
    def aux_loss(self, x, router_w, experts, group):
        n_experts, top_k = router_w.shape[1], experts.shape[1]
        probs = torch.softmax(x @ router_w, dim=-1)
        stats = torch.cat([torch.bincount(experts.reshape(-1), minlength=n_experts).to(probs.dtype),
                           probs.sum(0)]).detach()
        dist.all_reduce(stats, group=group)
        counts, prob_sums = stats[:n_experts], stats[n_experts:]
        pairs = float(counts.sum())
        if pairs == 0:
            return x.new_zeros(())
        return n_experts * (counts / pairs * prob_sums / (pairs / top_k)).sum()


moe_forward = Detached()
