"""matmul_reduce_scatter's backward computes w.grad from this rank's own rows only: x[rows r]ᵀ @ dout.

x.grad is right (the all-gather ring of dout), but w was used on every row of the sequence, so its gradient
needs the whole gathered dout: xᵀ @ [dout_0; ...; dout_{N-1}].
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_matmul_reduce_scatter_gradients"


class _OwnRows(ref._MatmulReduceScatter):
    @staticmethod
    def backward(ctx, dout):
        x, w = ctx.saved_tensors
        dx, _ = ctx.algorithm.all_gather_matmul(ctx.ring, dout.contiguous(), w.t())
        mine = ref.rows(x, ctx.ring.rank, dout.shape[0])
        return dx, ref.as_matrix(mine).t() @ ref.as_matrix(dout), None, None


def all_gather_matmul(x, w, group=None):
    return ref._AllGatherMatmul.apply(x, w, group, ref.CollectiveMatmul())


def matmul_reduce_scatter(x, w, group=None):
    return _OwnRows.apply(x, w, group, ref.CollectiveMatmul())
