"""Concatenates the two chunks in the wrong order: chunk 2N-1-r first, then chunk r."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_zigzag_shard_takes_chunks_r_and_2n_minus_1_minus_r"


def zigzag_shard(x, rank, world):
    check_layout(x, rank, world)
    pieces = x.tensor_split(2 * world, dim=SEQ)
    return torch.cat([pieces[2 * world - 1 - rank], pieces[rank]], dim=SEQ)
