"""Lets the pairs claim their experts' slots in token order (t * top_k + j): token 0's second choice takes a slot
before token 1's first choice.  The statement gives every first choice priority over every second choice."""
import math

import torch
import torch.nn.functional as F

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_capacity_drops_the_overflow"


class TokenOrder(ref.MoE):
    def kept(self, experts, n_experts, capacity_factor):
        tokens, top_k = experts.shape
        every_pair = torch.arange(tokens * top_k, device=experts.device)
        if capacity_factor is None:
            return every_pair
        capacity = math.ceil(capacity_factor * tokens * top_k / n_experts)
        claims = F.one_hot(experts.reshape(-1), n_experts)          # row t * top_k + j, in token order
        earlier = ((claims.cumsum(0) - 1) * claims).sum(1)
        return every_pair[earlier < capacity]


moe_forward = TokenOrder()
