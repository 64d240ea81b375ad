"""All-reduces the found-inf flag on the default group, ignoring group=: every data-parallel group skips together."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_runs_on_a_process_group"


class DistributedLossScaler(ref.DistributedLossScaler):
    def _agree(self, flag):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
