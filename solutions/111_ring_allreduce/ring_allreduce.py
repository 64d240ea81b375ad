"""Problem 111 reference: ring all-reduce from point-to-point."""
from __future__ import annotations

import torch
import torch.distributed as dist


class _Ring:
    """This rank's place in the ring of ``group``: its group rank, the size, and its neighbours' global ranks."""

    def __init__(self, group=None):
        self.group = group or dist.group.WORLD
        self.rank, self.n = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.right = dist.get_global_rank(self.group, (self.rank + 1) % self.n)
        self.left = dist.get_global_rank(self.group, (self.rank - 1) % self.n)

    def exchange(self, send: torch.Tensor, recv: torch.Tensor):
        """Send ``send`` to the right neighbour while receiving ``recv`` from the left one."""
        ops = []
        if send.numel():
            ops.append(dist.P2POp(dist.isend, send, self.right, self.group))
        if recv.numel():
            ops.append(dist.P2POp(dist.irecv, recv, self.left, self.group))
        for work in dist.batch_isend_irecv(ops) if ops else []:
            work.wait()


def _reduce_scatter_phase(chunks: list, ring: _Ring):
    """N-1 steps; afterwards ``chunks[ring.rank]`` holds the sum of that chunk over the ring."""
    for s in range(ring.n - 1):
        target = chunks[(ring.rank - s - 2) % ring.n]
        incoming = torch.empty_like(target)
        ring.exchange(chunks[(ring.rank - s - 1) % ring.n], incoming)
        target += incoming


def _all_gather_phase(chunks: list, ring: _Ring):
    """N-1 steps; ``chunks[ring.rank]`` is final before, every chunk is final after."""
    for s in range(ring.n - 1):
        ring.exchange(chunks[(ring.rank - s) % ring.n], chunks[(ring.rank - s - 1) % ring.n])


def ring_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    return _all_reduce(tensor, _Ring(group))


def _all_reduce(tensor: torch.Tensor, ring: _Ring) -> torch.Tensor:
    flat = tensor.flatten().clone()
    chunks = list(flat.tensor_split(ring.n))
    _reduce_scatter_phase(chunks, ring)
    _all_gather_phase(chunks, ring)
    tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_reduce_scatter(tensor: torch.Tensor, group=None) -> torch.Tensor:
    ring = _Ring(group)
    chunks = list(tensor.flatten().clone().tensor_split(ring.n))
    _reduce_scatter_phase(chunks, ring)
    return chunks[ring.rank].clone()


def ring_all_gather(chunk: torch.Tensor, group=None) -> torch.Tensor:
    ring = _Ring(group)
    if chunk.dim() == 0:
        raise ValueError("ring_all_gather: the chunk needs at least one dimension to concatenate along")
    out = chunk.new_empty((ring.n * chunk.shape[0], *chunk.shape[1:]))
    blocks = list(out.tensor_split(ring.n))
    blocks[ring.rank].copy_(chunk)
    _all_gather_phase(blocks, ring)
    return out
