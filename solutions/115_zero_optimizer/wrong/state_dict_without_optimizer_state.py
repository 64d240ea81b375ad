"""state_dict() saves only the master shard: the optimizer's moments and step counts are lost on resume."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_state_dict_round_trip"


class ShardedOptimizer(ref.ShardedOptimizer):
    def state_dict(self):
        sd = super().state_dict()
        del sd["local_optimizer"]
        return sd

    def load_state_dict(self, sd):
        self.shard.data.copy_(sd["shard"])
