"""Divides the gradients by the world size before the reduction and again after it."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matches_torch_zero_redundancy_optimizer"


class ShardedOptimizer(ref.ShardedOptimizer):
    def _flatten(self, tensors):
        return super()._flatten([t / self.world for t in tensors])
