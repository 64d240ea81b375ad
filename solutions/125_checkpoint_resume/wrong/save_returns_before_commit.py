"""save has no barrier after the commit: every rank but the committing one returns while COMMIT is still being
written, so a rank that goes on (or is killed then) cannot count on the checkpoint it just saved."""
import os

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_save_returns_once_committed"


class Trainer(ref.Trainer):
    def save(self, directory, step):
        self._write_and_commit(os.path.join(directory, f"step_{step}"), step)
