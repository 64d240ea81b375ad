"""fc2's bias is added on every rank before the reduce-scatter, so the output carries it t times."""
import torch.nn.functional as F

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_block_matches_single_device"


class SequenceParallelMLP(ref.SequenceParallelMLP):
    def forward(self, x):
        full = all_gather_sequence(self.ln(x), self.group)
        partial = F.linear(F.gelu(F.linear(full, self.fc1_weight, self.fc1_bias)), self.fc2_weight, self.fc2_bias)
        return x + reduce_scatter_sequence(partial, self.group)
