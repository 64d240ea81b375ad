"""Looks for NaN only (torch.isnan): an inf or -inf gradient goes unnoticed and the step is taken."""
import torch

import harness
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_matches_grad_scaler"


class DistributedLossScaler(ref.DistributedLossScaler):
    def _unscale_and_check(self, grads):
        found = False
        for g in grads:
            g.div_(self._scale)
            found = found or bool(torch.isnan(g).any())
        return torch.tensor([float(found)], device=harness.device())
