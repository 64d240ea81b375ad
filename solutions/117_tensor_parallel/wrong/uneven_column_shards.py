"""ColumnParallelLinear splits an indivisible out_features unevenly (tensor_split) instead of raising ValueError."""
import torch
import torch.distributed as dist
from torch import nn

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_indivisible_sizes_raise_value_error"


class ColumnParallelLinear(ref.ColumnParallelLinear):
    def __init__(self, full, gather_output=False, group=None):
        nn.Module.__init__(self)
        n, r = dist.get_world_size(group), dist.get_rank(group)
        rows = torch.arange(full.out_features, device=full.weight.device).tensor_split(n)[r]
        self.weight, self.bias = ref._shard(full.weight, rows, 0), ref._shard(full.bias, rows, 0)
        self.gather_output, self.group = gather_output, group
