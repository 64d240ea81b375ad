"""Builds the all-gather as a star, not a ring: each rank isends its x chunk straight to every other rank.

The values are right and there are N - 1 chunk-sized sends, but a rank talks to ranks that are not its
neighbours, and in both directions at once: every link of the machine carries traffic at the same time.
"""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_all_gather_matmul_passes_x_chunks_round_the_ring"


class Star(ref.CollectiveMatmul):
    def all_gather_matmul(self, ring, x, w):
        c, x = x.shape[0], x.contiguous()
        others = [j for j in range(ring.size) if j != ring.rank]
        arriving = {j: x.new_empty(x.shape) for j in others}
        works = [dist.isend(x, ring.global_rank(j), group=ring.group) for j in others]
        works += [dist.irecv(arriving[j], ring.global_rank(j), group=ring.group) for j in others]
        out = x.new_empty((ring.size * c, *x.shape[1:-1], w.shape[-1]))
        gathered = x.new_empty((ring.size * c, *x.shape[1:]))
        ref.rows(out, ring.rank, c)[...] = x @ w
        ref.rows(gathered, ring.rank, c)[...] = x
        ref.wait_all(works)
        for j in others:
            ref.rows(out, j, c)[...] = arriving[j] @ w
            ref.rows(gathered, j, c)[...] = arriving[j]
        return out, gathered


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, Star())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, Star())
