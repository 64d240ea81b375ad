"""Parallel3D splits the blocks with L // pp and never checks that pp divides L: blocks go missing."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_indivisible_model_raises_value_error"


class Parallel3D(ref.Parallel3D):
    def __init__(self, blocks, groups, microbatches, lr):
        pp = dist.get_world_size(groups.pp_group)
        keep = len(blocks) // pp * pp
        if keep == 0:                       # fewer blocks than stages: each stage takes the first block
            blocks, keep = list(blocks[:1]) * pp, pp
        super().__init__(blocks[:keep], groups, microbatches, lr)
