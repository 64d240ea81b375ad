"""resume takes the complete checkpoint whose COMMIT was modified last: a checkpoint copied out of order (its
files older than a smaller step's) loses to the older step."""
import json
import os

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_resume_on_another_world_size_matches_uninterrupted"


class Trainer(ref.Trainer):
    def _newest_complete(self, directory):
        markers = [os.path.join(directory, e, ref.MARKER) for e in os.listdir(directory) if e.startswith("step_")]
        markers = [m for m in markers if os.path.isfile(m)]
        if not markers:
            raise ref.CheckpointError(f"no complete checkpoint in {directory}")
        newest = max(markers, key=os.path.getmtime)
        with open(newest) as f:
            return os.path.dirname(newest), json.load(f)
