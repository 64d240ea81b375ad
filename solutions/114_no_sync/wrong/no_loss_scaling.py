"""Backpropagates each micro-batch's loss unscaled, so the accumulated gradient is k times too large."""
import contextlib

from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_train_step_matches_single_process"


def _backward(ddp, x, y, loss_fn, sync):
    with contextlib.nullcontext() if sync else ddp.no_sync():
        loss = loss_fn(ddp(x), y)
        loss.backward()
    return loss.item()


def train_step(ddp, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    optimizer.zero_grad()
    losses = [_backward(ddp, x, y, loss_fn, sync=i == k - 1) for i, (x, y) in enumerate(micro_batches)]
    optimizer.step()
    return sum(losses) / k
