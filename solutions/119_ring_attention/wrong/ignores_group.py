"""Ignores the group argument and runs the ring over every rank of the default group."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_runs_on_a_process_group"


class WholeWorld(ref.RingAttention):
    def ring(self, group):
        return ref.Ring(None)


ring_attention = WholeWorld()
