"""Grows the scale after every clean step, ignoring growth_interval."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_scale_sequence_matches_grad_scaler"


class DistributedLossScaler(ref.DistributedLossScaler):
    def update(self):
        self._scale *= self.backoff_factor if self._found_inf else self.growth_factor
        self._found_inf = None
