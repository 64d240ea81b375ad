"""__len__ always rounds up, ceil(dataset_len / num_replicas), even when drop_last rounds down."""
import math

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_lengths_equal"


class ShardSampler(ref.ShardSampler):
    def __len__(self):
        return math.ceil(self.dataset_len / self.num_replicas)
