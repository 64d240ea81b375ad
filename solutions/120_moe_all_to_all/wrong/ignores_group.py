"""Ignores the group argument: the all-to-alls run over every rank of the default group."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_runs_on_a_process_group"


class WholeWorld(ref.MoE):
    def __call__(self, x, router_w, w1, w2, top_k, group=None):
        return super().__call__(x, router_w, w1, w2, top_k, None)


moe_forward = WholeWorld()
