"""The gradients are all-reduced with SUM and never divided by the group's size: N times the mean."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_values_and_gradients_unchanged"


def train_step(units, plan, x, y, loss_fn, group=None):
    loss = loss_fn(ref._checkpointed(units, plan, x), y)
    loss.backward()
    for unit in units:
        for p in unit.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
    return loss.item()
