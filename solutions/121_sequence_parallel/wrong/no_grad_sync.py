"""finish_grad_sync does nothing: ln's and fc2's bias gradients keep only this rank's rows of the sequence."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_replicated_gradients_match_the_full_block"


class SequenceParallelMLP(ref.SequenceParallelMLP):
    def finish_grad_sync(self):
        pass
