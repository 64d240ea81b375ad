"""Seeds each rank's shuffle with seed + epoch + rank, so the ranks shuffle differently and their shards overlap."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_multi_rank_shards_cover_dataset"


class ShardSampler(ref.ShardSampler):
    def _shuffle_seed(self):
        return self.seed + self.epoch + self.rank
