"""Slices the fused qkv weight into N contiguous row blocks, mixing q, k and v heads across ranks."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_parallel_self_attention"


class ParallelSelfAttention(ref.ParallelSelfAttention):
    def __init__(self, qkv, proj, num_heads, group=None):
        super().__init__(qkv, proj, num_heads, group)
        n, r = dist.get_world_size(group), dist.get_rank(group)
        k = qkv.out_features // n
        naive = torch.arange(r * k, (r + 1) * k, device=qkv.weight.device)
        self.qkv_weight = ref._shard(qkv.weight, naive, 0)
        self.qkv_bias = ref._shard(qkv.bias, naive, 0)
