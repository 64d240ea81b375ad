"""resume re-seeds the dropout generator with seed instead of restoring its saved state: the masks start over."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_resume_on_another_world_size_matches_uninterrupted"


class Trainer(ref.Trainer):
    def resume(self, directory):
        step = super().resume(directory)
        self.generator = torch.Generator().manual_seed(self.seed)
        return step
