"""One all-reduce per parameter instead of one per bucket."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_one_async_all_reduce_per_bucket_during_backward"


class BucketedDDP(ref.BucketedDDP):
    def _grad_ready(self, i):
        self._per_param = getattr(self, "_per_param", [])
        self._per_param.append(dist.all_reduce(self.params[i].grad, async_op=True))

    def finish_gradient_sync(self):
        for work in self._per_param:
            work.wait()
        for p in self.params:
            p.grad /= dist.get_world_size()
        self._per_param = []
