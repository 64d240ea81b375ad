"""Prefetches in the forward but not in the backward: each unit's backward gathers its own parameters on
demand, so the backward's all_gathers never travel while the unit before them computes."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_next_unit_all_gather_issued_before_current_unit_computes"


class FullyShardedModel(ref.FullyShardedModel):
    def _before_backward(self, unit):
        if unit.pending is None:
            self._refill(unit)
        self._wait(unit)
