"""Sums the routing statistics with torch.distributed.nn.functional.all_reduce, the differentiable one: its
backward all-reduces the gradient again, so each rank's router_w.grad holds N times its own tokens' part (and
backward issues an all_reduce)."""
import warnings

import torch
import torch.distributed.nn.functional as dist_autograd

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_aux_loss_gradient"


class Autograd(ref.MoE):
    def aux_loss(self, x, router_w, experts, group):
        n_experts, top_k = router_w.shape[1], experts.shape[1]
        probs = torch.softmax(x @ router_w, dim=-1)
        stats = torch.cat([torch.bincount(experts.reshape(-1), minlength=n_experts).to(probs.dtype), probs.sum(0)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stats = dist_autograd.all_reduce(stats, group=group)
        counts, prob_sums = stats[:n_experts], stats[n_experts:]
        pairs = float(counts.sum())
        if pairs == 0:
            return x.new_zeros(())
        return n_experts * (counts / pairs * prob_sums / (pairs / top_k)).sum()


moe_forward = Autograd()
