"""With compute_dtype, casts the whole module to bf16 before sharding it: the shards, which are the
optimizer's master copy, are bf16, so every update smaller than a bf16 step of the parameter is lost."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_compute_dtype_matches_fsdp2_mixed_precision"


class FullyShardedModel(ref.FullyShardedModel):
    def __init__(self, module, group=None, compute_dtype=None):
        if compute_dtype is not None:
            module = module.to(compute_dtype)
        super().__init__(module, group, compute_dtype)
