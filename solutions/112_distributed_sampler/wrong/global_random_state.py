"""Shuffles with the global random state (torch.randperm without a generator), not one seeded with seed + epoch."""
import torch

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_deterministic_for_seed_and_epoch"


class ShardSampler(ref.ShardSampler):
    def _order(self):
        if not self.shuffle:
            return list(range(self.dataset_len))
        return torch.randperm(self.dataset_len).tolist()
