"""After averaging each gradient, also broadcasts the parameter from rank 0 "to keep the replicas from
drifting": the training is right, but every sync moves twice the bytes it needs."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_one_sync_per_step"


class AccumulatingDDP(ref.AccumulatingDDP):
    def _average_grad(self, p):
        if not self.require_backward_grad_sync:
            return
        super()._average_grad(p)
        dist.broadcast(p.data, src=0)
