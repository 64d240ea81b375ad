"""Frozen parameters are all-reduced every step too, 'to keep them in sync': they never change."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_frozen_parameters_never_communicated"


class BucketedDDP(ref.BucketedDDP):
    def finish_gradient_sync(self):
        super().finish_gradient_sync()
        for p in self.module.parameters():
            if not p.requires_grad:
                dist.all_reduce(p.data)
                p.data /= dist.get_world_size()
