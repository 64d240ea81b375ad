"""Gives each rank a contiguous block of the padded order instead of every num_replicas-th index."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matches_torch_distributed_sampler"


class ShardSampler(ref.ShardSampler):
    def __iter__(self):
        start = self.rank * self.num_samples
        return iter(self._even(self._order())[start:start + self.num_samples])
