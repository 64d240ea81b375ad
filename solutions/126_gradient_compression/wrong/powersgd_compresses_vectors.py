"""Compresses the 1-D biases too (as n x 1 matrices): exact, but (n + 1) elements on the wire instead of n."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_powersgd_bytes_are_the_low_rank_size"


def powersgd_hook(state, bucket):
    mats = [(p, g.view(g.shape[0], -1)) for p, g in zip(bucket.parameters(), bucket.gradients())]
    ref._compress(state, mats, state.process_group, dist.get_world_size(state.process_group))
    return ref.torch.futures.collect_all([]).then(lambda _: bucket.buffer())
