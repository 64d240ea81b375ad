"""A damaged newest checkpoint is skipped for the previous complete one: training silently goes back in time."""
import json
import os

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_damaged_checkpoint_raises_checkpoint_error_naming_the_file"


class Trainer(ref.Trainer):
    def _newest_complete(self, directory):
        steps = [int(e[5:]) for e in os.listdir(directory)
                 if e.startswith("step_") and os.path.isfile(os.path.join(directory, e, ref.MARKER))]
        for step in sorted(steps, reverse=True):
            folder = os.path.join(directory, f"step_{step}")
            with open(os.path.join(folder, ref.MARKER)) as f:
                meta = json.load(f)
            try:
                for name, digest in meta["files"].items():
                    self._load_part(folder, name, digest)
            except ref.CheckpointError:
                continue          # try an older one
            return folder, meta
        raise ref.CheckpointError(f"no usable checkpoint in {directory}")
