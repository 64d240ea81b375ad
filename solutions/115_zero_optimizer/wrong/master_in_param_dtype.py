"""Ignores master_dtype: the shard and the optimizer state stay in the parameters' (bfloat16) dtype."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_bf16_params_with_fp32_master"


class ShardedOptimizer(ref.ShardedOptimizer):
    def __init__(self, params, optimizer_cls, stage=2, group=None, master_dtype=None, **opt_kwargs):
        super().__init__(params, optimizer_cls, stage=stage, group=group, master_dtype=None, **opt_kwargs)
