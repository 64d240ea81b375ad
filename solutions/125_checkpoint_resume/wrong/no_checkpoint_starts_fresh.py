"""resume with no complete checkpoint quietly returns step 0 and trains from scratch instead of raising."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_damaged_checkpoint_raises_checkpoint_error_naming_the_file"


class Trainer(ref.Trainer):
    def resume(self, directory):
        try:
            self._newest_complete(directory)
        except ref.CheckpointError:
            return 0
        return super().resume(directory)
