"""Collectives from point-to-point: your ring_all_reduce, ring_reduce_scatter and ring_all_gather beside
torch's dist.all_reduce, dist.reduce_scatter_tensor and dist.all_gather_into_tensor.

One step is one collective on one float32 tensor.  The ring: N-1 steps of reduce-scatter, each rank
sending one of N chunks to its right neighbour and adding the one from its left, then N-1 steps of
all-gather passing the finished chunks on, so every rank sends 2(N-1)/N of the tensor's bytes
(reduce-scatter or all-gather alone: (N-1)/N).  torch's rows count the bytes handed to the
collective, its input: gloo's own algorithm moves about as much on the wire.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .measure import Comparison, Contender

NUMEL = 1 << 20   # elements per rank: 4 MiB of float32


def describe() -> str:
    return f"one float32 tensor of {NUMEL} elements ({NUMEL * 4 // 2**20} MiB) per rank per step"


def warm_up(device):
    """The backend's first collective and exchange of this size, before any contender (its buffers and threads)."""
    tensor = torch.ones(NUMEL, device=device)
    dist.all_reduce(tensor)
    right, left = (dist.get_rank() + 1) % dist.get_world_size(), (dist.get_rank() - 1) % dist.get_world_size()
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, right), dist.P2POp(dist.irecv, tensor.clone(), left)]):
        work.wait()


def comparisons(mine, device) -> list:
    world = dist.get_world_size()

    def contender(label, collective, numel=NUMEL):
        """``collective(tensor)`` on a fresh copy of this rank's seeded tensor each step (the copy is on both sides)."""
        def build():
            g = torch.Generator().manual_seed(dist.get_rank())
            data = torch.randn(numel, generator=g).to(device)
            tensor = torch.empty_like(data)

            def step(i):
                tensor.copy_(data)
                collective(tensor)
            return step
        return Contender(label, build)

    def reduce_scatter_tensor(t):
        dist.reduce_scatter_tensor(t.new_empty(t.numel() // world), t)

    def all_gather_into_tensor(t):
        dist.all_gather_into_tensor(t.new_empty(t.numel() * world), t)

    chunk = NUMEL // world        # all_gather: each rank's chunk, so the gathered tensor has about NUMEL elements
    scattered = chunk * world     # reduce_scatter_tensor: a multiple of N elements
    return [
        Comparison(contender("torch  dist.all_reduce", dist.all_reduce),
                   [contender("yours  ring_all_reduce", mine.ring_all_reduce)]),
        Comparison(contender("torch  dist.reduce_scatter_tensor", reduce_scatter_tensor, scattered),
                   [contender("yours  ring_reduce_scatter", mine.ring_reduce_scatter, scattered)]),
        Comparison(contender("torch  dist.all_gather_into_tensor", all_gather_into_tensor, chunk),
                   [contender("yours  ring_all_gather", mine.ring_all_gather, chunk)]),
    ]
