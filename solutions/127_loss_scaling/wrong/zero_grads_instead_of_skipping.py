"""On an overflow, zeroes the gradients and still calls optimizer.step(): momentum and weight decay move the weights."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_overflow_on_one_rank_skips_everywhere"


class DistributedLossScaler(ref.DistributedLossScaler):
    def step(self, optimizer):
        if self._found_inf is None:
            self.unscale_(optimizer)
        if self._found_inf:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.zero_()
        return optimizer.step()
