"""train_step returns the last micro-batch's MSE, not the replica's loss (the sum of MSE / m)."""
import torch.nn.functional as F

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_train_step_returns_the_loss"


class Parallel3D(ref.Parallel3D):
    def _loss(self, out, y):
        self.last_mse = F.mse_loss(out, y).item()
        return super()._loss(out, y)

    def train_step(self, x, y):
        return None if super().train_step(x, y) is None else self.last_mse
