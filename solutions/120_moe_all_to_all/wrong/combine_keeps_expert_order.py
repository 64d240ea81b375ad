"""Combines the returned rows in expert order: forgets to undo the sort that grouped them by expert."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_output_matches_single_device"


class NoUnsort(ref.MoE):
    def combine(self, returned, order, weights, tokens, top_k, d):
        return (returned.view(tokens, top_k, d) * weights.unsqueeze(-1)).sum(1)


moe_forward = NoUnsort()
