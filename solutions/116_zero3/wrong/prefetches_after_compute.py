"""Issues the next unit's all_gather from the forward hook, once the current unit has computed: the gather
travels while nothing (or only a Tanh) runs, not while the unit computes."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_next_unit_all_gather_issued_before_current_unit_computes"


class FullyShardedModel(ref.FullyShardedModel):
    def _before_forward(self, unit):
        self._gather(unit)

    def _after_forward(self, unit, out):
        super()._after_forward(unit, out)
        if unit.next is not None:
            self._prefetch(unit.next)
