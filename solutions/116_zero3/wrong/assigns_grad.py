"""Assigns the reduce-scattered gradient to the shard's .grad instead of adding to it: a second backward
before the optimizer step throws the first one's gradient away."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_backward_passes_accumulate_into_shard_grads"


class FullyShardedModel(ref.FullyShardedModel):
    def _after_backward(self, unit):
        unit.shard.grad = self._reduce_gradient(unit, unit.full.grad)
        unit.full.grad = None
        self._free(unit)
