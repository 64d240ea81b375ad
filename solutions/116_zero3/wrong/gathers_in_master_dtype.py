"""With compute_dtype, all-gathers the float32 master shard and casts the full vector to bf16 afterwards:
the units compute in bf16, but every all_gather carries float32, twice the bytes mixed precision saves."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_compute_dtype_all_gathers_carry_bf16"


class FullyShardedModel(ref.FullyShardedModel):
    def _issue_gather(self, unit, out):
        if out.dtype == unit.shard.dtype:
            return super()._issue_gather(unit, out)
        master = torch.empty(out.numel(), dtype=unit.shard.dtype, device=out.device)
        dist.all_gather_into_tensor(master, unit.shard.detach(), group=self.group)
        out.copy_(master)
        unit.pending = None
