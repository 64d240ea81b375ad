"""Pads with N - P % N elements, so when P % N == 0 it adds a whole extra row: S = P/N + 1."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_bytes_per_step_match_ring_costs"


class ShardedOptimizer(ref.ShardedOptimizer):
    @staticmethod
    def _shard_size(numel, world):
        return (numel + world - numel % world) // world
