"""step() always unscales, even when the caller already called unscale_(): the gradients are divided twice."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_matches_grad_scaler"


class DistributedLossScaler(ref.DistributedLossScaler):
    def unscale_(self, optimizer):
        self._found_inf = None   # no "already unscaled" guard
        super().unscale_(optimizer)

    def step(self, optimizer):
        self.unscale_(optimizer)
        if not self._found_inf:
            return optimizer.step()
        return None
