"""A sampler that keeps each epoch's permutation in a module-level cache and reads its shard as a column.

The padded (or truncated) order, a tensor of num_samples * R indices, is reshaped to (num_samples, R) and
rank r takes column r, which is indices[r::R].  The permutation for (dataset_len, seed + epoch) is computed
once per process and shared by every sampler in it; the epoch is a property.
"""
import math

import torch
from torch.utils.data import Sampler

_PERMUTATIONS = {}


def _permutation(n, seed):
    if (n, seed) not in _PERMUTATIONS:
        _PERMUTATIONS[n, seed] = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return _PERMUTATIONS[n, seed]


class ShardSampler(Sampler):
    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        super().__init__()
        for name, bad in (("num_replicas", num_replicas < 1), ("rank", not 0 <= rank < max(num_replicas, 1)),
                          ("dataset_len", dataset_len < 0)):
            if bad:
                raise ValueError(f"ShardSampler: {name} is out of range "
                                 f"(dataset_len={dataset_len}, num_replicas={num_replicas}, rank={rank})")
        self.args = dict(n=dataset_len, replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        per_rank = dataset_len / num_replicas
        self.num_samples = math.floor(per_rank) if drop_last else math.ceil(per_rank)
        self.epoch = 0

    @property
    def epoch(self):
        return self._epoch

    @epoch.setter
    def epoch(self, value):
        self._epoch = value

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.num_samples

    def __iter__(self):
        a = self.args
        order = _permutation(a["n"], a["seed"] + self.epoch) if a["shuffle"] else torch.arange(a["n"])
        total = self.num_samples * a["replicas"]
        if total > order.numel():
            order = order.repeat(math.ceil(total / order.numel()))
        return iter(order[:total].view(self.num_samples, a["replicas"])[:, a["rank"]].tolist())
