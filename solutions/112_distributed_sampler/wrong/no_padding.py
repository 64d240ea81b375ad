"""Never pads: without drop_last the first dataset_len % num_replicas ranks get one index more than the others."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_lengths_equal"


class ShardSampler(ref.ShardSampler):
    def _even(self, indices):
        return indices[:self.num_samples * self.num_replicas] if self.drop_last else indices
