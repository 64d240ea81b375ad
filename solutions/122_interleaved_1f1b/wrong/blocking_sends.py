"""run_interleaved sends with blocking dist.send: two neighbours that both send first wait on each other forever."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_no_deadlock"


class _BlockingRing(ref._Ring):
    def send(self, tensor, peer):
        if self.alone:
            return super().send(tensor, peer)
        dist.send(tensor.detach().contiguous(), peer, group=self.group)


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    r, p = dist.get_rank(group), dist.get_world_size(group)
    ring = _BlockingRing(group, act_shape, next(chunks[0].parameters()).dtype)
    return ref._run(chunks, schedule[r], microbatches, loss_fn, ring, r, p)
