"""Returns the mean of the scaled losses, loss / k, which is k times smaller than the mean loss."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_train_step_returns_mean_loss"


def train_step(ddp, optimizer, micro_batches, loss_fn):
    return ref.train_step(ddp, optimizer, micro_batches, loss_fn) / len(micro_batches)
