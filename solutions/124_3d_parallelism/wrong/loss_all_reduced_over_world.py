"""train_step all-reduces the loss over the whole world to return one global number on every rank."""
import torch
import torch.distributed as dist

import harness
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_communication_stays_confined"


class Parallel3D(ref.Parallel3D):
    def train_step(self, x, y):
        loss = super().train_step(x, y)
        total = torch.tensor([loss or 0.0], dtype=torch.float64, device=harness.device())
        dist.all_reduce(total)
        return loss
