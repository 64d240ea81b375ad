"""Shard size P // N instead of ceil(P / N): when P % N != 0 the last elements belong to no rank and never train."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matches_single_process_training"


class ShardedOptimizer(ref.ShardedOptimizer):
    @staticmethod
    def _shard_size(numel, world):
        return numel // world

    def _flatten(self, tensors):
        return torch.cat([t.reshape(-1) for t in tensors])[:self.world * self.shard_size]

    def _gather_parameters(self):
        full = torch.empty(self.world * self.shard_size, dtype=self.dtype, device=self.shard.device)
        dist.all_gather_into_tensor(full, self.shard.detach().to(self.dtype), group=self.group)
        flat = torch.cat([p.reshape(-1) for p in self.params])
        flat[:full.numel()] = full
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
