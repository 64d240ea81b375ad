"""all_gather_sequence's backward keeps this rank's rows of its own gradient (117's gather_from_tp): no reduction."""
from types import FunctionType

import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_all_gather_sequence"


def _own_rows(grad, group):
    return grad.chunk(dist.get_world_size(group))[dist.get_rank(group)].contiguous()


def all_gather_sequence(x, group=None):
    return ref._Mirror.apply(x, group, ref._gather_rows, _own_rows)


class SequenceParallelMLP(ref.SequenceParallelMLP):
    forward = FunctionType(ref.SequenceParallelMLP.forward.__code__, globals())   # the reference's, calling the above
