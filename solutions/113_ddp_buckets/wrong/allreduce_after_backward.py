"""No overlap: the hooks only count, and every bucket is all-reduced after backward returns."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_one_async_all_reduce_per_bucket_during_backward"


class BucketedDDP(ref.BucketedDDP):
    def _grad_ready(self, i):
        pass

    def finish_gradient_sync(self):
        for b, bucket in enumerate(self.buckets):
            flat = torch.cat([self.params[j].grad.flatten() for j in bucket])
            self._pending.append((b, flat, dist.all_reduce(flat, async_op=True)))
        super().finish_gradient_sync()
