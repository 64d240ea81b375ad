"""ORs each step's overflow into one flag that update() never clears: after an overflow every step is skipped."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_scale_sequence_matches_grad_scaler"


class DistributedLossScaler(ref.DistributedLossScaler):
    _any_inf = False

    def unscale_(self, optimizer):
        super().unscale_(optimizer)
        self._any_inf |= self._found_inf
        self._found_inf = self._any_inf
