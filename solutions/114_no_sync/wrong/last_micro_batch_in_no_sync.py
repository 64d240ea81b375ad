"""Runs every micro-batch, the last one too, inside no_sync(), so the gradients are never averaged."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_train_step_matches_single_process"


def train_step(ddp, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    losses = [ref._backward(ddp, x, y, loss_fn, k, sync=False) for x, y in micro_batches]
    optimizer.step()
    return sum(losses) / k
