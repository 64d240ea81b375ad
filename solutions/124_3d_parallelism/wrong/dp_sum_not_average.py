"""train_step sums the gradients over the dp group and forgets to divide by dp."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_training_matches_single_process"


class Parallel3D(ref.Parallel3D):
    def _average_over_dp(self):
        for p in self.parameters():
            dist.all_reduce(p.grad, group=self.groups.dp_group)
