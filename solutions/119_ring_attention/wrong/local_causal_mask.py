"""Builds the causal mask from positions inside the chunk, not from global sequence positions."""
import torch

import harness
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_causal_mask_at_chunk_borders"


class LocalMask(ref.RingAttention):
    def mask(self, q_chunk, k_chunk, length, causal):
        if not causal:
            return None
        return torch.ones(length, length, dtype=torch.bool, device=harness.device()).tril()


ring_attention = LocalMask()
