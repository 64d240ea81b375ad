"""ColumnParallelLinear keeps the full weight and bias on every rank and slices them in forward."""
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_parameters_are_shards"


class ColumnParallelLinear(ref.ColumnParallelLinear):
    def __init__(self, full, gather_output=False, group=None):
        super().__init__(full, gather_output, group)
        self.full_weight = nn.Parameter(full.weight.detach().clone())
        self.full_bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())
        self.weight = self.bias = None

    def forward(self, x):
        n, r = dist.get_world_size(self.group), dist.get_rank(self.group)
        w = self.full_weight.chunk(n, 0)[r]
        b = None if self.full_bias is None else self.full_bias.chunk(n, 0)[r]
        y = F.linear(copy_to_tp(x, self.group), w, b)
        return gather_from_tp(y, self.group) if self.gather_output else y


class ParallelMLP(ref.ParallelMLP):
    def __init__(self, fc1, fc2, group=None):
        super().__init__(fc1, fc2, group)
        self.fc1 = ColumnParallelLinear(fc1, gather_output=False, group=group)
