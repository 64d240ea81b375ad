"""Rank 0 writes COMMIT before the parts are written (no barrier first): a save killed midway looks complete."""
import json
import os

import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_killed_save_leaves_the_last_complete_checkpoint"


class Trainer(ref.Trainer):
    def save(self, directory, step):
        folder = os.path.join(directory, f"step_{step}")
        os.makedirs(folder, exist_ok=True)
        if self.rank == 0:
            meta = {"step": step, "world_size": self.world, "numel": self.numel,
                    "files": {f"rank_{r}.pt": None for r in range(self.world)}}
            with open(os.path.join(folder, ref.MARKER), "w") as f:
                json.dump(meta, f)
        self._write_part(os.path.join(folder, f"rank_{self.rank}.pt"), self._part())
        dist.barrier()

    @staticmethod
    def _load_part(folder, name, digest):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise ref.CheckpointError(f"checkpoint file {path} is missing")
        return ref.torch.load(path, map_location="cpu")
