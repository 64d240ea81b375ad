"""The constructor splits fc1's f columns with floor division and never checks that t divides f: no ValueError."""
import copy

import torch.distributed as dist
from torch import nn

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_indivisible_sizes_raise_value_error"


class SequenceParallelMLP(ref.SequenceParallelMLP):
    def __init__(self, ln, fc1, fc2, group=None):
        nn.Module.__init__(self)
        t, r = dist.get_world_size(group), dist.get_rank(group)
        k = fc1.out_features // t
        own = slice(r * k, (r + 1) * k)
        self.ln = copy.deepcopy(ln)
        self.fc1_weight = nn.Parameter(fc1.weight.detach()[own].clone())
        self.fc1_bias = None if fc1.bias is None else nn.Parameter(fc1.bias.detach()[own].clone())
        self.fc2_weight = nn.Parameter(fc2.weight.detach()[:, own].clone())
        self.fc2_bias = None if fc2.bias is None else nn.Parameter(fc2.bias.detach().clone())
        self.group = group
