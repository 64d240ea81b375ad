"""Gathers each unit once more at the start of its backward, "so the values are surely fresh", after the
prefetched gather has already brought them: the gradients are right, but the backward moves twice the
all-gather bytes in twice the messages."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_two_all_gathers_and_one_reduce_scatter_per_unit"


class FullyShardedModel(ref.FullyShardedModel):
    def _before_backward(self, unit):
        super()._before_backward(unit)
        shard = unit.shard.detach().to(self._dtype(unit))
        dist.all_gather_into_tensor(unit.full.data, shard, group=self.group)
