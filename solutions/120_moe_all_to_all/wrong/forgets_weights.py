"""Sums the k expert outputs of a token without multiplying them by the router weights."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_output_matches_single_device"


class Unweighted(ref.MoE):
    def combine(self, returned, order, weights, tokens, top_k, d):
        return returned[order.argsort()].view(tokens, top_k, d).sum(1)


moe_forward = Unweighted()
