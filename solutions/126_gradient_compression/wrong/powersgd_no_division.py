"""Never divides Q = sum_i M_i^T P by the world size: the weights get the sum over ranks, not the average."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_powersgd_full_rank_is_exact"


def powersgd_hook(state, bucket):
    pairs = list(zip(bucket.parameters(), bucket.gradients()))
    ref._average_exactly([g for _, g in pairs if g.dim() <= 1], state.process_group,
                         ref.dist.get_world_size(state.process_group))
    mats = [(p, g.view(g.shape[0], -1)) for p, g in pairs if g.dim() >= 2]
    if mats:
        ref._compress(state, mats, state.process_group, 1)
    return ref.torch.futures.collect_all([]).then(lambda _: bucket.buffer())
