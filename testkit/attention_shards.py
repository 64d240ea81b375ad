"""Attention on shards of the sequence, for the sequence-parallel attention problems' tests (119, 128).

    chunk_of(t, index, shards)      in the test process: shard ``index`` of the sequence dimension of a
                                    [B, H, S, D] tensor (what the rank holding that shard receives), as a copy
    forward_backward(mine, attend)  on a rank: ``attend(q, k, v)`` on its own shard inside phase "forward", then,
                                    given its ``dout``, the backward inside phase "backward"
"""
from __future__ import annotations

import torch

import harness


def chunk_of(t, index: int, shards: int):
    """A copy, never a view: a pickled view carries its whole storage, which would hand a rank the whole
    sequence."""
    return t.tensor_split(shards, dim=2)[index].clone(memory_format=torch.contiguous_format)


def forward_backward(mine, attend) -> dict:
    """``mine``: this rank's {"qkv": [q, k, v], "dout": its shard of the output gradient, or None for forward
    only}.  {"out": what ``attend`` returned (detached)} and, with ``dout``, "grads": [q.grad, k.grad, v.grad]."""
    backward = mine["dout"] is not None
    q, k, v = (t.requires_grad_(backward) for t in mine["qkv"])
    with harness.phase("forward"):
        out = attend(q, k, v)
    result = {"out": out.detach() if isinstance(out, torch.Tensor) else out}
    if backward:
        with harness.phase("backward"):
            out.backward(mine["dout"])
        result["grads"] = [q.grad, k.grad, v.grad]
    return result
