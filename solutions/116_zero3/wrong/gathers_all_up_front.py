"""Gathers every unit's parameters when the model's forward starts, so all of them are full at once."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_no_unit_holds_full_parameters_outside_its_own_pass"


class FullyShardedModel(ref.FullyShardedModel):
    def __init__(self, module, group=None):
        super().__init__(module, group)
        self._gathered = set()

    def forward(self, x):
        for unit in self._units:
            ref.FullyShardedModel._gather(self, unit)
            self._gathered.add(unit.index)
        return super().forward(x)

    def _gather(self, unit):
        if unit.index not in self._gathered:
            super()._gather(unit)
        self._gathered.discard(unit.index)
