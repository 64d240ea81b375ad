"""Problem 112 reference: a distributed sampler that matches torch's DistributedSampler."""
from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler


class ShardSampler(Sampler):
    def __init__(self, dataset_len: int, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        super().__init__()
        self.dataset_len, self.num_replicas, self.rank = dataset_len, num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self._check_arguments()
        if drop_last:
            self.num_samples = dataset_len // num_replicas
        else:
            self.num_samples = math.ceil(dataset_len / num_replicas)

    def _check_arguments(self):
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {self.num_replicas}")
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank must be in [0, {self.num_replicas - 1}], got {self.rank}")
        if self.dataset_len < 0:
            raise ValueError(f"dataset_len must be at least 0, got {self.dataset_len}")

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def _shuffle_seed(self) -> int:
        return self.seed + self.epoch

    def _order(self) -> list:
        """This epoch's order of the whole dataset: the same on every rank.

        The indices are host data, drawn on the CPU (where the generator is) on every rank, GPU or not."""
        if not self.shuffle:
            return list(range(self.dataset_len))
        gen = torch.Generator().manual_seed(self._shuffle_seed())
        return torch.randperm(self.dataset_len, generator=gen, device="cpu").tolist()

    def _even(self, indices: list) -> list:
        """Pad (repeating from the start) or truncate to num_samples * num_replicas indices."""
        total = self.num_samples * self.num_replicas
        if self.drop_last or not indices:
            return indices[:total]
        return (indices * math.ceil(total / len(indices)))[:total]

    def __iter__(self):
        return iter(self._even(self._order())[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
