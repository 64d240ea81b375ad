"""Sums the gradients over ranks but never divides by the world size."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matches_single_process_training"


class ShardedOptimizer(ref.ShardedOptimizer):
    def _reduce_gradients(self):
        return super()._reduce_gradients() * self.world
