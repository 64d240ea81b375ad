"""Sizes each expert's capacity from the tokens instead of the (token, choice) pairs: ceil(capacity_factor * T_r
/ E), top_k times too few slots when top_k = 2."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_capacity_drops_the_overflow"


class PerToken(ref.MoE):
    def kept(self, experts, n_experts, capacity_factor):
        per_token = None if capacity_factor is None else capacity_factor / experts.shape[1]
        return super().kept(experts, n_experts, per_token)


moe_forward = PerToken()
