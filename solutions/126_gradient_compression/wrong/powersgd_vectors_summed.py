"""Forgets to divide the exactly all-reduced 1-D gradients by the world size: biases get the sum."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_powersgd_vectors_are_averaged_exactly"


def powersgd_hook(state, bucket):
    group = state.process_group
    pairs = list(zip(bucket.parameters(), bucket.gradients()))
    ref._average_exactly([g for _, g in pairs if g.dim() <= 1], group, 1)
    mats = [(p, g.view(g.shape[0], -1)) for p, g in pairs if g.dim() >= 2]
    if mats:
        ref._compress(state, mats, group, dist.get_world_size(group))
    return ref.torch.futures.collect_all([]).then(lambda _: bucket.buffer())
