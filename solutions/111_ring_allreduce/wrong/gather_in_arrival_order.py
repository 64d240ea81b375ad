"""ring_all_gather concatenates the chunks in the order they arrive (its own first), not in rank order."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_all_gather_concatenates_in_rank_order"


def ring_all_gather(chunk, group=None):
    ring = ref._Ring(group)
    pieces = [chunk]
    for _ in range(ring.n - 1):
        incoming = torch.empty_like(chunk)
        ring.exchange(pieces[-1], incoming)
        pieces.append(incoming)
    return torch.cat(pieces)
