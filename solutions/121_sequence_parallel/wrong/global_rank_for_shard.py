"""The constructor picks its fc1/fc2 shard by dist.get_rank() (the global rank), not its rank in the group."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_runs_on_a_sub_group"


class SequenceParallelMLP(ref.SequenceParallelMLP):
    def __init__(self, ln, fc1, fc2, group=None):
        super().__init__(ln, fc1, fc2, group=group)
        t, r, f = dist.get_world_size(group), dist.get_rank(), fc1.out_features
        own = slice(r * f // t, (r + 1) * f // t)
        self.fc1_weight.data = fc1.weight.detach()[own].clone()
        if self.fc1_bias is not None:
            self.fc1_bias.data = fc1.bias.detach()[own].clone()
        self.fc2_weight.data = fc2.weight.detach()[:, own].clone()
