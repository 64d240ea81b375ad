"""The row-parallel layer adds fc2's whole bias on every tp rank before the all_reduce: tp times in all."""
import torch.nn.functional as F

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_training_matches_single_process"


class TPBlock(ref.TPBlock):
    def forward(self, x):
        x = ref._TPAllReduce.apply(x, self.group, False)
        out = F.linear(F.gelu(F.linear(x, self.w1, self.b1)), self.w2, self.b2)
        return ref._TPAllReduce.apply(out, self.group, True)


class Parallel3D(ref.Parallel3D):
    def __init__(self, blocks, groups, microbatches, lr):
        super().__init__(blocks, groups, microbatches, lr)
        for block in self.blocks:
            block.__class__ = TPBlock
