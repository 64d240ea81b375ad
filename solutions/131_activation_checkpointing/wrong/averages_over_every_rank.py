"""The gradients are averaged over every rank, not over ``group``: with several data-parallel groups, each
replica takes the other groups' gradients into its own."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_values_and_gradients_unchanged"


def train_step(units, plan, x, y, loss_fn, group=None):
    loss = loss_fn(ref._checkpointed(units, plan, x), y)
    loss.backward()
    world = dist.get_world_size()
    for unit in units:
        for p in unit.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(world)
    return loss.item()
