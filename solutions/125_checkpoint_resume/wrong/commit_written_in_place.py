"""No temporary name, no rename, no fsync: each part is torch.save'd straight to its final name, and COMMIT is
open()ed under its final name and json.dump'ed into.  A kill before a file event leaves nothing wrong; a kill in
the middle of COMMIT's write leaves a half-written COMMIT that says the checkpoint is complete."""
import json
import os

import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_save_killed_mid_write_keeps_the_previous_checkpoint"


class Trainer(ref.Trainer):
    @staticmethod
    def _write_part(path, part):
        torch.save(part, path)

    def _commit(self, folder, step):
        files = {f"rank_{r}.pt": ref._sha256(os.path.join(folder, f"rank_{r}.pt")) for r in range(self.world)}
        with open(os.path.join(folder, ref.MARKER), "w") as f:
            json.dump({"step": step, "world_size": self.world, "numel": self.numel, "files": files}, f)
