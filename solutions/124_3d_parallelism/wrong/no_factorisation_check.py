"""make_groups never checks dp*tp*pp == world_size, so a wrong factorisation builds groups anyway."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_bad_factorisation_raises_value_error"


def make_groups(world_size, dp, tp, pp):
    rank = dist.get_rank()
    pp_rank, rest = divmod(rank, dp * tp)
    dp_rank, tp_rank = divmod(rest, tp)
    ranks = [r for r in range(world_size) if r // (dp * tp) == pp_rank and (r // tp) % dp == dp_rank]
    group = dist.new_group(ranks)
    return ref.Groups(group, group, group, dp_rank, tp_rank, pp_rank)
