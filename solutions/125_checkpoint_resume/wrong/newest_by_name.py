"""resume takes the newest checkpoint by sorting the folder names as text: step_9 comes after step_10."""
import json
import os

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_resume_on_another_world_size_matches_uninterrupted"


class Trainer(ref.Trainer):
    def _newest_complete(self, directory):
        names = sorted(e for e in os.listdir(directory) if os.path.isfile(os.path.join(directory, e, ref.MARKER)))
        if not names:
            raise ref.CheckpointError(f"no complete checkpoint in {directory}")
        folder = os.path.join(directory, names[-1])
        with open(os.path.join(folder, ref.MARKER)) as f:
            return folder, json.load(f)
