"""Tests the count before counting this step: the scale grows after growth_interval + 1 clean steps."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_scale_sequence_matches_grad_scaler"


class DistributedLossScaler(ref.DistributedLossScaler):
    def update(self):
        if self._found_inf:
            self._scale, self._clean_steps = self._scale * self.backoff_factor, 0
        elif self._clean_steps == self.growth_interval:
            self._scale, self._clean_steps = self._scale * self.growth_factor, 0
        else:
            self._clean_steps += 1
        self._found_inf = None
