"""Stage 2 reduce-scatters the gradients but keeps the full ones alive: the gradient memory is not sharded."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_stage2_keeps_only_a_gradient_shard"


class ShardedOptimizer(ref.ShardedOptimizer):
    def step(self):
        grads = [p.grad for p in self.params]
        super().step()
        for p, g in zip(self.params, grads):
            p.grad = g
