"""resume takes the newest step_<k> folder whether or not it holds COMMIT: a torn save is loaded (or fails)."""
import json
import os

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_killed_save_leaves_the_last_complete_checkpoint"


class Trainer(ref.Trainer):
    def _newest_complete(self, directory):
        steps = [int(e[5:]) for e in os.listdir(directory) if e.startswith("step_") and e[5:].isdigit()]
        if not steps:
            raise ref.CheckpointError(f"no checkpoint in {directory}")
        folder = os.path.join(directory, f"step_{max(steps)}")
        marker = os.path.join(folder, ref.MARKER)
        if os.path.isfile(marker):
            with open(marker) as f:
                return folder, json.load(f)
        parts = sorted(f for f in os.listdir(folder) if f.startswith("rank_") and f.endswith(".pt"))
        meta = {"step": max(steps), "numel": self.numel, "files": {name: None for name in parts}}
        return folder, meta

    @staticmethod
    def _load_part(folder, name, digest):
        path = os.path.join(folder, name)
        if digest is None:
            return ref.torch.load(path, map_location="cpu")
        return ref.Trainer._load_part(folder, name, digest)
