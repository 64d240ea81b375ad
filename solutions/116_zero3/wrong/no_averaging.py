"""Reduce-scatters the gradient as a sum over ranks and forgets to divide by the world size."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matches_single_process_training"


class FullyShardedModel(ref.FullyShardedModel):
    def _reduce_gradient(self, unit, full_grad):
        grad = torch.empty_like(unit.shard)
        dist.reduce_scatter_tensor(grad, full_grad, group=self.group)
        return grad
