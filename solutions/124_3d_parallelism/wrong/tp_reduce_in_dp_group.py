"""Each block's row-parallel all_reduce (and f's backward) runs in the dp group instead of the tp group."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_training_matches_single_process"


class Parallel3D(ref.Parallel3D):
    def __init__(self, blocks, groups, microbatches, lr):
        super().__init__(blocks, groups, microbatches, lr)
        for block in self.blocks:
            block.group = groups.dp_group
