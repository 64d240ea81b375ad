"""Only the forward is a ring: matmul_reduce_scatter's backward gathers dout with one broadcast per rank.

The gradients are right, but the backward falls back on collectives (N broadcasts of one chunk each, every
rank receiving from every rank) instead of the all-gather ring the forward already has.
"""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_backward_stays_on_the_ring"


class _Broadcasts(ref._MatmulReduceScatter):
    @staticmethod
    def backward(ctx, dout):
        x, w = ctx.saved_tensors
        ring, dout = ctx.ring, dout.contiguous()
        chunks = []
        for j in range(ring.size):
            chunk = dout.clone() if j == ring.rank else torch.empty_like(dout)
            dist.broadcast(chunk, ring.global_rank(j), group=ring.group)
            chunks.append(chunk)
        gathered = torch.cat(chunks)
        return gathered @ w.t(), ref.as_matrix(x).t() @ ref.as_matrix(gathered), None, None


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, ref.CollectiveMatmul())


def matmul_reduce_scatter(x, w, group=None):
    return _Broadcasts.apply(x, w, group, ref.CollectiveMatmul())
