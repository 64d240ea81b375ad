"""The bucket's all-reduce runs synchronously inside the hook, stalling backward."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_one_async_all_reduce_per_bucket_during_backward"


class _Done:
    def wait(self):
        pass


class BucketedDDP(ref.BucketedDDP):
    def _grad_ready(self, i):
        b = self._bucket_of[i]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            flat = torch.cat([self.params[j].grad.flatten() for j in self.buckets[b]])
            dist.all_reduce(flat)
            self._pending.append((b, flat, _Done()))
