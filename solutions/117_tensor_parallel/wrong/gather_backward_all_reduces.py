"""gather_from_tp's backward all-reduces the gradient before taking its slice: N times too large, and extra traffic."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_gather_from_tp"


class _GatherFromTP(ref._GatherFromTP):
    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return ref._split_last(grad, ctx.group), None


def gather_from_tp(x, group=None):
    return _GatherFromTP.apply(x, group)
