"""With compute_dtype, reduce-scatters the bf16 gradient as it comes out of backward and casts its slice to
float32 afterwards: the sum over ranks is rounded to bf16 (FSDP2's reduce_dtype=float32 reduces in float32)."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_compute_dtype_all_gathers_carry_bf16"


class FullyShardedModel(ref.FullyShardedModel):
    def _reduce_gradient(self, unit, full_grad):
        grad = torch.empty(unit.shard_size, dtype=full_grad.dtype, device=full_grad.device)
        dist.reduce_scatter_tensor(grad, full_grad, group=self.group)
        return grad.to(unit.shard.dtype) / self.world
