"""finish_grad_sync averages the replicated gradients over the group (DP's rule) instead of summing them."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_replicated_gradients_match_the_full_block"


class SequenceParallelMLP(ref.SequenceParallelMLP):
    def finish_grad_sync(self):
        for p in [*self.ln.parameters(), self.fc2_bias]:
            if p is not None and p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)
                p.grad /= dist.get_world_size(self.group)
