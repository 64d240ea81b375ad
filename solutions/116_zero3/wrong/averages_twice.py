"""Divides the unit's gradient by the world size before the reduce-scatter and again after it."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matches_torch_fsdp2"


class FullyShardedModel(ref.FullyShardedModel):
    def _reduce_gradient(self, unit, full_grad):
        return super()._reduce_gradient(unit, full_grad / self.world)
