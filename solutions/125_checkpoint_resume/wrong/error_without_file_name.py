"""A damaged checkpoint raises CheckpointError, but the message names the step's folder, not which file."""
import os

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_damaged_checkpoint_raises_checkpoint_error_naming_the_file"


class Trainer(ref.Trainer):
    @staticmethod
    def _load_part(folder, name, digest):
        try:
            return ref.Trainer._load_part(folder, name, digest)
        except ref.CheckpointError:
            raise ref.CheckpointError(f"checkpoint {os.path.basename(folder)} is damaged") from None
