"""step() relies on the caller's unscale_(): without it, nothing is unscaled or checked and the step always runs."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_matches_grad_scaler"


class DistributedLossScaler(ref.DistributedLossScaler):
    def step(self, optimizer):
        if self._found_inf is None:
            self._found_inf = False
        return super().step(optimizer)
