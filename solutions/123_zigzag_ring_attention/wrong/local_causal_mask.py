"""Builds the causal mask from positions inside the shard (0 .. 2c-1 on every rank), not global zigzag ones."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_forward_matches_causal_attention"


class LocalMask(ZigzagAttention):
    def positions(self, rank, world, c, device):
        return torch.arange(2 * c, device=device)


def zigzag_ring_attention(q, k, v, group=None):
    return LocalMask()(q, k, v, group)
