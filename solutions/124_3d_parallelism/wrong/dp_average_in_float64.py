"""The dp all_reduce sums float32 gradients in float64, for a more accurate average: right values, twice the dp bytes."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_bytes_per_step"


class Parallel3D(ref.Parallel3D):
    def _average_over_dp(self):
        params, dp = list(self.parameters()), dist.get_world_size(self.groups.dp_group)
        flat = torch.cat([p.grad.reshape(-1) for p in params]).to(torch.float64)
        dist.all_reduce(flat, group=self.groups.dp_group)
        flat /= dp
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))
