"""run_pipeline all-reduces the loss so every stage can return it: a collective the pipeline does not need."""
import torch
import torch.distributed as dist

import harness
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_p2p_goes_to_neighbours_only"


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    total = ref.run_pipeline(stage_module, ops, act_shape, inputs, targets, loss_fn, group)
    loss = torch.tensor([total or 0.0], dtype=torch.float64, device=harness.device())
    dist.all_reduce(loss, group=group)
    return total
