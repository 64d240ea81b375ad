"""resume restores the parameters but starts a fresh optimizer: momentum and Adam's moments and step are lost."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_optimizer_state_is_resharded"


class Trainer(ref.Trainer):
    def _load_optimizer(self, parts):
        pass
