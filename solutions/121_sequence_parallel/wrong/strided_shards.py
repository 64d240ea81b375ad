"""Rank r's shard is the strided rows r, r+t, r+2t, ... (round-robin) instead of the contiguous block r."""
from types import FunctionType

import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_reduce_scatter_sequence"


def _strided_to_blocks(x, group):
    """Reorder rows so that block r holds rows r, r+t, r+2t, ...: [s/t, t, ...] -> [t, s/t, ...]."""
    t = dist.get_world_size(group)
    return x.unflatten(0, (x.shape[0] // t, t)).transpose(0, 1).flatten(0, 1).contiguous()


def _blocks_to_strided(x, group):
    t = dist.get_world_size(group)
    return x.unflatten(0, (t, x.shape[0] // t)).transpose(0, 1).flatten(0, 1).contiguous()


def _gather(x, group):
    return _blocks_to_strided(ref._gather_rows(x, group), group)


def _scatter(x, group):
    return ref._scatter_rows(_strided_to_blocks(x, group), group)


def all_gather_sequence(x, group=None):
    return ref._Mirror.apply(x, group, _gather, _scatter)


def reduce_scatter_sequence(x, group=None):
    return ref._Mirror.apply(x, group, _scatter, _gather)


class SequenceParallelMLP(ref.SequenceParallelMLP):
    forward = FunctionType(ref.SequenceParallelMLP.forward.__code__, globals())   # the reference's, calling the above
