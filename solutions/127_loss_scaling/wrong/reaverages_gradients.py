"""Spreads an overflow by all-reducing the gradients again instead of a flag: a second gradient all-reduce."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_found_inf_flag_is_all_reduced_each_step"


class DistributedLossScaler(ref.DistributedLossScaler):
    def _unscale_and_check(self, grads):
        for g in grads:
            dist.all_reduce(g, group=self.group)   # an inf on any rank is now on every rank
            g.div_(dist.get_world_size(self.group))
        return super()._unscale_and_check(grads)

    def _agree(self, flag):
        return bool(flag.item())
