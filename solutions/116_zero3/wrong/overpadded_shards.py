"""Pads each unit with N - P % N elements, so when P % N == 0 every shard carries one element too many."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_parameters_are_flat_padded_shards"


class FullyShardedModel(ref.FullyShardedModel):
    @staticmethod
    def _shard_size(numel, world):
        return (numel + world - numel % world) // world
