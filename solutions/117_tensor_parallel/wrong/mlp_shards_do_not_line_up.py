"""ParallelMLP shards fc1's rows in contiguous blocks but fc2's columns round-robin: the shards do not line up."""
import torch
import torch.distributed as dist
from torch import nn

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_parallel_mlp"


class ParallelMLP(ref.ParallelMLP):
    def __init__(self, fc1, fc2, group=None):
        super().__init__(fc1, fc2, group)
        n, r = dist.get_world_size(group), dist.get_rank(group)
        cols = torch.arange(r, fc2.in_features, n, device=fc2.weight.device)
        self.fc2.weight = nn.Parameter(fc2.weight.detach().index_select(1, cols).clone())
