"""Treats any stage other than 1 as stage 2 instead of rejecting it."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_bad_input_raises_value_error"


class ShardedOptimizer(ref.ShardedOptimizer):
    def __init__(self, params, optimizer_cls, stage=2, group=None, master_dtype=None, **opt_kwargs):
        super().__init__(params, optimizer_cls, stage=1 if stage == 1 else 2, group=group,
                         master_dtype=master_dtype, **opt_kwargs)
