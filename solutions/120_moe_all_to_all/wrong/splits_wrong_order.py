"""Sums the per-expert counts as if experts were dealt round-robin (e % N), not in blocks (e // E_local)."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_dispatch_sends_each_token_choice_once"


class RoundRobinSplits(ref.MoE):
    def rank_splits(self, per_expert, size, e_local):
        return per_expert.view(e_local, size).sum(0).tolist()


moe_forward = RoundRobinSplits()
