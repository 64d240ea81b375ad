"""Zeroes the dropped pairs' weights in place, on the softmax's output: the forward is right, but softmax's backward
needs that output, and autograd refuses the modified tensor."""
import torch

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_gradients_with_dropping"


class InPlace(ref.MoE):
    def __call__(self, x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
        self.capacity_factor = capacity_factor
        return super().__call__(x, router_w, w1, w2, top_k, group, capacity_factor, return_stats)

    def route(self, x, router_w, top_k):
        weights, experts = super().route(x, router_w, top_k)
        if self.capacity_factor is not None:
            dropped = torch.ones(experts.numel(), dtype=torch.bool, device=x.device)
            dropped[self.kept(experts, router_w.shape[1], self.capacity_factor)] = False
            weights[dropped.view(experts.shape)] = 0.0
        return weights, experts


moe_forward = InPlace()
