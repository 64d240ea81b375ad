"""A sampler that never builds the padded list: rank r's k-th index is order[(r + k*R) % n].

Padding repeats the order from its start, so position p of the padded order is position p % n of the order
itself; drop_last only lowers the number of positions.  __iter__ is a generator that yields Python ints one
at a time, computed from that formula, and the arguments are checked before Sampler.__init__ runs.
"""
import torch
from torch.utils.data import Sampler


class ShardSampler(Sampler):
    def __init__(self, dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False):
        if num_replicas < 1 or not 0 <= rank < num_replicas or dataset_len < 0:
            raise ValueError(f"ShardSampler: bad arguments dataset_len={dataset_len}, "
                             f"num_replicas={num_replicas}, rank={rank}")
        super().__init__()
        self._n, self._replicas, self._rank = dataset_len, num_replicas, rank
        self._shuffle, self._seed, self._drop_last = shuffle, seed, drop_last
        self._epoch = 0

    def set_epoch(self, epoch):
        self._epoch = epoch

    def __len__(self):
        whole, rest = divmod(self._n, self._replicas)
        return whole + (1 if rest and not self._drop_last else 0)

    def __iter__(self):
        if self._shuffle:
            order = torch.randperm(self._n, generator=torch.Generator().manual_seed(self._seed + self._epoch))
        else:
            order = torch.arange(self._n)
        for k in range(len(self)):
            yield int(order[(self._rank + k * self._replicas) % self._n])
