"""Drops the error feedback: what rank-r compression leaves out is lost at every step, so updates drift."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_error_feedback_keeps_the_sum_of_updates_close"


class PowerSGDState(ref.PowerSGDState):
    def _remember(self, p, compressed_input, result, Q):
        super()._remember(p, result, result, Q)      # the error stays zero
