"""Keeps a full-size master copy and makes the shard a view into it: S elements to look at, N*S in memory."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_optimizer_state_is_sharded"


class ShardedOptimizer(ref.ShardedOptimizer):
    def __init__(self, params, optimizer_cls, stage=2, group=None, master_dtype=None, **opt_kwargs):
        super().__init__(params, optimizer_cls, stage, group, master_dtype, **opt_kwargs)
        master = self._flatten([p.detach() for p in self.params]).to(self.master_dtype)   # every element
        self.shard = master[self._own].detach().requires_grad_(True)   # a leaf, but its storage is all N*S
        self.local_optimizer = optimizer_cls([self.shard], **opt_kwargs)
