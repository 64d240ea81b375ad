"""RowParallelLinear all-reduces its replicated bias's gradient, as if it were data-parallel: N times too large."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_weight_grads_are_slices_of_full_grads"


def _summed(grad, group):
    grad = grad.clone()
    dist.all_reduce(grad, group=group)
    return grad


class RowParallelLinear(ref.RowParallelLinear):
    def __init__(self, full, input_is_parallel=True, group=None):
        super().__init__(full, input_is_parallel, group)
        if self.bias is not None:
            self.bias.register_hook(lambda grad: _summed(grad, group))
