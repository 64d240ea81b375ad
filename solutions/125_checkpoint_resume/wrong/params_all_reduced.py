"""Shares the updated shards by all-reducing a zero-filled full-size vector with this rank's shard in place,
instead of an all_gather of the shards: right parameters, N times the bytes the gather needs."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_resume_on_another_world_size_matches_uninterrupted"


class Trainer(ref.Trainer):
    def train_step(self):
        batch = self._batch()
        b = len(batch)
        keep = torch.rand((b, self.dataset.in_features), generator=self.generator, dtype=torch.float64,
                          device="cpu") >= self.dropout
        mine, keep = batch[self.rank::self.world], keep[self.rank::self.world]
        for p in self.params:
            p.grad = None
        if mine:
            xs, ys = zip(*(self.dataset[i] for i in mine))
            here, dtype = self.params[0].device, self.params[0].dtype
            x = (torch.stack(xs) * keep / (1 - self.dropout)).to(here, dtype)
            (((self.model(x) - torch.stack(ys).to(here, dtype)) ** 2).sum() / b).backward()
        grad = self._flat([torch.zeros_like(p) if p.grad is None else p.grad for p in self.params])
        dist.all_reduce(grad)
        with torch.no_grad():
            self.shard.grad = grad[self._own].clone()
            self.local_optimizer.step()
            full = torch.zeros_like(grad)
            full[self._own] = self.shard.detach()
            dist.all_reduce(full)                  # every other rank's slice is 0 here: the sum is the gather
            self._write_params(full)
        self.step += 1
