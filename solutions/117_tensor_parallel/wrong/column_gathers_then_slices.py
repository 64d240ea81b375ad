"""ColumnParallelLinear always gathers its output, then slices its own part back out: right values, extra traffic."""
import torch.nn.functional as F

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_communication_per_layer"


class ColumnParallelLinear(ref.ColumnParallelLinear):
    def forward(self, x):
        y = gather_from_tp(F.linear(copy_to_tp(x, self.group), self.weight, self.bias), self.group)
        return y if self.gather_output else ref._ScatterToTP.apply(y, self.group)
