"""Splits the heads by dist.get_world_size() instead of the group's size: right on the default group, wrong
(a failed reshape or an all_to_all of the wrong blocks) on a group of some of the ranks."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_ulysses_on_a_process_group"


class WholeWorld(ref.Ulysses):
    def size(self, group):
        return dist.get_world_size()


def ulysses_attention(q, k, v, causal=False, group=None):
    return WholeWorld()(q, k, v, causal, group)
