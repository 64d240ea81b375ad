"""No sharding: every rank all-reduces the gradients and keeps the optimizer state of every element."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_optimizer_state_is_sharded"


class ShardedOptimizer(ref.ShardedOptimizer):
    @property
    def _own(self):
        return slice(0, self.world * self.shard_size)

    def _reduce_gradients(self):
        flat = self._flatten([p.grad for p in self.params])
        dist.all_reduce(flat, group=self.group)
        return flat / self.world

    def _gather_parameters(self):
        offset = 0
        for p in self.params:
            p.copy_(self.shard[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
