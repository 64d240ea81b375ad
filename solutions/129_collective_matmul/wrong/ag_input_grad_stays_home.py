"""all_gather_matmul's backward keeps x.grad local: this rank's rows of dout @ wᵀ, with no reduce-scatter.

Every rank's output used x, each through its own columns w_j, so x.grad is the sum over the ranks of
dout_j @ w_jᵀ (rows of x's chunk): the other ranks' contributions never arrive.
"""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_all_gather_matmul_gradients"


class _StaysHome(ref._AllGatherMatmul):
    @staticmethod
    def backward(ctx, dout):
        gathered, w = ctx.saved_tensors
        c = gathered.shape[0] // ctx.ring.size
        dx = ref.rows(dout, ctx.ring.rank, c) @ w.t()
        return dx, ref.as_matrix(gathered).t() @ ref.as_matrix(dout), None, None


def all_gather_matmul(x, w, group=None):
    return _StaysHome.apply(x, w, group, ref.CollectiveMatmul())


def matmul_reduce_scatter(x, w, group=None):
    return ref._MatmulReduceScatter.apply(x, w, group, ref.CollectiveMatmul())
