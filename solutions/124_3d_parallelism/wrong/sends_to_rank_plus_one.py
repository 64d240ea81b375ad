"""The pipeline's neighbours are global ranks r - 1 and r + 1, not r -/+ dp*tp (the same (dp, tp) next stage)."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_eight_ranks_dp2_tp2_pp2"


class Parallel3D(ref.Parallel3D):
    def __init__(self, blocks, groups, microbatches, lr):
        super().__init__(blocks, groups, microbatches, lr)
        import torch.distributed as dist
        rank = dist.get_rank()
        self.prev = rank - 1 if self.prev is not None else None
        self.next = rank + 1 if self.next is not None else None
