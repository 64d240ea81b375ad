"""unscale_ walks only optimizer.param_groups[0]: the second group's gradients stay scaled and are never checked,
so an inf there is stepped into the weights."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_overflow_on_one_rank_skips_everywhere"


class DistributedLossScaler(ref.DistributedLossScaler):
    def unscale_(self, optimizer):
        if self._found_inf is not None:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        grads = [p.grad for p in optimizer.param_groups[0]["params"] if p.grad is not None]
        self._found_inf = self._agree(self._unscale_and_check(grads))
