"""Shares the updated shards by all-reducing a zero-filled full-size vector with this rank's shard in place,
instead of an all_gather of the shards: right parameters, N times the bytes the gather needs."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_resume_on_another_world_size_matches_uninterrupted"


class Trainer(ref.Trainer):
    def train_step(self):
        grad = self._flat(self._local_gradients())
        dist.all_reduce(grad)
        with torch.no_grad():
            self.shard.grad = grad[self._own].clone()
            self.local_optimizer.step()
            full = torch.zeros_like(grad)
            full[self._own] = self.shard.detach()
            dist.all_reduce(full)                  # every other rank's slice is 0 here: the sum is the gather
            self._write_params(full)
        self.step += 1
