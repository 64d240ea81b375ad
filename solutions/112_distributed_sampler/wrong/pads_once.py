"""Pads by repeating the start of the order only once, too little when the padding is longer than the dataset."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_lengths_equal"


class ShardSampler(ref.ShardSampler):
    def _even(self, indices):
        total = self.num_samples * self.num_replicas
        return indices[:total] if self.drop_last else indices + indices[:total - len(indices)]
