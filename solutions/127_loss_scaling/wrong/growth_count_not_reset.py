"""An overflow backs the scale off but leaves the count of clean steps as it was, so growth comes too early."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_scale_sequence_matches_grad_scaler"


class DistributedLossScaler(ref.DistributedLossScaler):
    def update(self):
        count, overflow = self._clean_steps, self._found_inf
        super().update()
        if overflow:
            self._clean_steps = count
