"""make_groups lets dp vary fastest, tp and dp swapped (rank = pp_rank*dp*tp + tp_rank*dp + dp_rank)."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_groups_follow_megatron_order"


def make_groups(world_size, dp, tp, pp):
    g = ref.make_groups(world_size, tp, dp, pp)      # Megatron's grid with the two inner sizes swapped
    return ref.Groups(g.tp_group, g.dp_group, g.pp_group, g.tp_rank, g.dp_rank, g.pp_rank)
