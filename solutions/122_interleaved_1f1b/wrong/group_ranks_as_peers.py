"""run_interleaved passes the neighbours' group ranks (r -+ 1) % p to send/recv, which take global ranks."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_runs_inside_a_group"


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    r, p = dist.get_rank(group), dist.get_world_size(group)
    ring = ref._Ring(group, act_shape, next(chunks[0].parameters()).dtype)
    ring.prev, ring.next = (r - 1) % p, (r + 1) % p
    return ref._run(chunks, schedule[r], microbatches, loss_fn, ring, r, p)
