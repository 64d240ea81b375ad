"""Skips on the group's decision but backs off on the local one: the scales, then the weights, drift apart."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_parameters_identical_across_ranks"


class DistributedLossScaler(ref.DistributedLossScaler):
    def _agree(self, flag):
        self._local_inf = bool(flag.item())
        return super()._agree(flag)

    def update(self):
        self._found_inf = self._local_inf
        super().update()
