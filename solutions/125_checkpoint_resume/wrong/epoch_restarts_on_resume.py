"""The data position is kept as the epoch only: after resume the epoch's order starts again from its first batch."""
import math

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_every_sample_once_per_epoch_across_the_resume"


class Trainer(ref.Trainer):
    resumed_at = 0

    def resume(self, directory):
        self.resumed_at = super().resume(directory)
        return self.resumed_at

    def _position(self):
        per_epoch = math.ceil(len(self.dataset) / self.global_batch)
        epoch = self.resumed_at // per_epoch                    # set_epoch(epoch), then iterate from the start
        return epoch + (self.step - self.resumed_at) // per_epoch, (self.step - self.resumed_at) % per_epoch
