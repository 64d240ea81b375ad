"""An overflow is detected as isfinite(grad.sum()): float16 gradients whose elements are all finite but whose sum
passes 65504 look like an overflow, so a clean step is skipped and the scale backed off."""
import torch

import harness
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_float16_gradients_whose_sum_overflows_are_clean"


class DistributedLossScaler(ref.DistributedLossScaler):
    def _unscale_and_check(self, grads):
        flag = torch.zeros(1, device=harness.device())
        for g in grads:
            g.div_(self._scale)
            flag = torch.maximum(flag, (~torch.isfinite(g.sum())).float().reshape(1))
        return flag
