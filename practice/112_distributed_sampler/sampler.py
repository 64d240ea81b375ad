"""Problem 112: Distributed sampler.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 112``.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler


class ShardSampler(Sampler):
    """This rank's share of a dataset's indices: exactly what ``torch.utils.data.DistributedSampler`` yields.

    ``ShardSampler(dataset_len, num_replicas, rank, shuffle=True, seed=0, drop_last=False)``:
      * raises ValueError when num_replicas < 1, rank < 0, rank >= num_replicas or dataset_len < 0;
      * each epoch's order is ``torch.randperm(dataset_len)`` drawn from a ``torch.Generator``
        seeded with ``seed + epoch`` (``list(range(dataset_len))`` without shuffle); the indices
        are host data, so draw them on the CPU (``device="cpu"``), not on ``harness.device()``;
      * without drop_last, that list is padded by repeating it from its start, as often as
        needed, up to a multiple of num_replicas; with drop_last it is truncated down to one;
      * this rank yields ``indices[rank::num_replicas]``.
    """

    def __init__(self, dataset_len: int, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        super().__init__()
        raise NotImplementedError("ShardSampler.__init__: see README.md, 'ShardSampler'")

    def set_epoch(self, epoch: int):
        """Use ``epoch`` for the next iterations' shuffle (the generator's seed is ``seed + epoch``)."""
        raise NotImplementedError("ShardSampler.set_epoch: see README.md, 'ShardSampler'")

    def __iter__(self):
        """This rank's indices for the current epoch."""
        raise NotImplementedError("ShardSampler.__iter__: see README.md, 'Padding and dropping'")

    def __len__(self) -> int:
        """How many indices ``__iter__`` yields: the same on every rank."""
        raise NotImplementedError("ShardSampler.__len__: see README.md, 'Padding and dropping'")
