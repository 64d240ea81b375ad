"""RowParallelLinear all-reduces its partial outputs over the whole world, ignoring its group argument."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_layers_respect_the_group_argument"


class _ReduceOverWorld(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.contiguous().clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class RowParallelLinear(ref.RowParallelLinear):
    def forward(self, x):
        if not self.input_is_parallel:
            x = ref._ScatterToTP.apply(x, self.group)
        y = _ReduceOverWorld.apply(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias
