"""RowParallelLinear adds the whole bias on every rank before the all-reduce, so it is counted N times."""
import torch.nn.functional as F

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_row_parallel_linear"


class RowParallelLinear(ref.RowParallelLinear):
    def forward(self, x):
        if not self.input_is_parallel:
            x = ref._ScatterToTP.apply(x, self.group)
        return reduce_from_tp(F.linear(x, self.weight, self.bias), self.group)
