"""Drops by masking: every pair is still dispatched and combined, and a pair past its expert's capacity only gets
weight 0.  The outputs are right, but the all_to_alls carry T_r * top_k rows, not the kept ones."""
import torch

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_dispatch_shrinks_to_the_capacity"


class Masking(ref.MoE):
    def __call__(self, x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
        self.capacity_factor = capacity_factor
        return super().__call__(x, router_w, w1, w2, top_k, group, None, return_stats)

    def route(self, x, router_w, top_k):
        weights, experts = super().route(x, router_w, top_k)
        if self.capacity_factor is None:
            return weights, experts
        fits = torch.zeros(experts.numel(), dtype=torch.bool, device=x.device)
        fits[super().kept(experts, router_w.shape[1], self.capacity_factor)] = True
        return weights * fits.view(experts.shape), experts


moe_forward = Masking()
