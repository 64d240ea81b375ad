"""Shards the parameters, but first keeps a numpy copy of the whole model (for full_state_dict, later): every
rank holds all the parameters again, where the tensor walk cannot see them."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_resident_memory_holds_only_shards"


class FullyShardedModel(ref.FullyShardedModel):
    def __init__(self, module, group=None):
        self.full_copy = [p.detach().numpy().copy() for p in module.parameters()]
        super().__init__(module, group)
