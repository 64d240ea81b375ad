"""Every file, COMMIT included, is written straight under its final name: a kill inside the write leaves it empty."""
import os

import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_save_killed_mid_write_keeps_the_previous_checkpoint"


def _write_durably(path, obj):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class Trainer(ref.Trainer):
    @staticmethod
    def _write_part(path, part):
        _write_durably(path, part)

    def _commit(self, folder, step):
        files = {f"rank_{r}.pt": ref._sha256(os.path.join(folder, f"rank_{r}.pt")) for r in range(self.world)}
        _write_durably(os.path.join(folder, ref.MARKER),
                       {"step": step, "world_size": self.world, "numel": self.numel, "files": files})

    def _newest_complete(self, directory):
        steps = [int(e[5:]) for e in os.listdir(directory)
                 if e.startswith("step_") and os.path.isfile(os.path.join(directory, e, ref.MARKER))]
        if not steps:
            raise ref.CheckpointError(f"no complete checkpoint in {directory}")
        folder = os.path.join(directory, f"step_{max(steps)}")
        return folder, torch.load(os.path.join(folder, ref.MARKER))
