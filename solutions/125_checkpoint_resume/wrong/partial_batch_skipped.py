"""resume recomputes the data position with n // B batches per epoch, as if the partial last batch did not exist."""
import math

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_every_sample_once_per_epoch_across_the_resume"


class Trainer(ref.Trainer):
    resumed_at, resumed_position = 0, (0, 0)

    def resume(self, directory):
        self.resumed_at = super().resume(directory)
        self.resumed_position = divmod(self.resumed_at, max(1, len(self.dataset) // self.global_batch))
        return self.resumed_at

    def _position(self):
        per_epoch = math.ceil(len(self.dataset) / self.global_batch)
        epoch, j = self.resumed_position
        epoch_more, j = divmod(j + self.step - self.resumed_at, per_epoch)
        return epoch + epoch_more, j
