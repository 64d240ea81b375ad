"""make_groups numbers the grid with pp varying fastest (rank = tp_rank*dp*pp + dp_rank*pp + pp_rank)."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_groups_follow_megatron_order"


def make_groups(world_size, dp, tp, pp):
    if dp * tp * pp != world_size:
        raise ValueError(f"dp*tp*pp = {dp * tp * pp} is not the world size {world_size}")
    return ref._build_groups(dp, tp, pp, lambda p, d, t, dp, tp, pp: t * dp * pp + d * pp + p)
