"""Gathers before every use but never frees: after the first step every unit holds its full parameters."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_no_unit_holds_full_parameters_outside_its_own_pass"


class FullyShardedModel(ref.FullyShardedModel):
    def _free(self, unit):
        pass
