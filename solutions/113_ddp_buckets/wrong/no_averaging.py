"""Sums the gradients across ranks but forgets to divide by the world size."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_ddp_matches_single_process_training"


class BucketedDDP(ref.BucketedDDP):
    def finish_gradient_sync(self):
        for b, flat, work in self._pending:
            work.wait()
            offset = 0
            for j in self.buckets[b]:
                g = self.params[j].grad
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        self._pending.clear()
        self._ready = [0] * len(self.buckets)
