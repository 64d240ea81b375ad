"""train_step never enters no_sync(), so each of the k backward passes averages the gradients."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_one_sync_per_step"


def train_step(ddp, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    losses = [ref._backward(ddp, x, y, loss_fn, k, sync=True) for x, y in micro_batches]
    optimizer.step()
    return sum(losses) / k
