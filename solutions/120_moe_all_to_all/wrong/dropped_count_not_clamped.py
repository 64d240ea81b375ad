"""Counts the dropped pairs as sum_e (count_e - capacity), without clamping at 0: an expert with free slots
subtracts from the overflow of the others."""
import math

import torch

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_dropped_count_is_reported"


class Unclamped(ref.MoE):
    def __call__(self, x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
        out = super().__call__(x, router_w, w1, w2, top_k, group, capacity_factor, return_stats)
        if not return_stats or capacity_factor is None:
            return out
        n_experts = router_w.shape[1]
        _, experts = self.route(x, router_w, top_k)
        capacity = math.ceil(capacity_factor * x.shape[0] * top_k / n_experts)
        overflow = torch.bincount(experts.reshape(-1), minlength=n_experts) - capacity
        return out[0], out[1], int(overflow.sum())


moe_forward = Unclamped()
