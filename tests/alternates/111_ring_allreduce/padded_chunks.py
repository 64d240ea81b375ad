"""A ring all-reduce that zero-pads every chunk to ceil(numel/N) elements, as NCCL does.

Row i of an (N, ceil(numel/N)) zero buffer holds chunk i of tensor_split(N), padded at its end, so every
message has the same size and no step is skipped: the smaller chunks carry a padding element, and when
numel < N some messages carry nothing but padding.  The bytes stay within the ring bound, and the padding is
cut off at the end.
"""
import math

import torch
import torch.distributed as dist


def _place(group):
    group = group or dist.group.WORLD
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    return group, rank, n, dist.get_global_rank(group, (rank + 1) % n), dist.get_global_rank(group, (rank - 1) % n)


def _padded_rows(flat, n):
    """The (N, ceil(numel/N)) buffer, and each row's length without its padding."""
    pieces = flat.tensor_split(n)
    rows = flat.new_zeros((n, math.ceil(flat.numel() / n)))
    for row, piece in zip(rows, pieces):
        row[:piece.numel()] = piece
    return rows, [piece.numel() for piece in pieces]


def _step(send, recv, place):
    group, _, _, right, left = place
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, right, group),
                                    dist.P2POp(dist.irecv, recv, left, group)])
    for work in works:
        work.wait()


def _reduce_scatter(chunks, place):
    _, rank, n, _, _ = place
    for s in range(n - 1):
        incoming = torch.empty_like(chunks[0])
        _step(chunks[(rank - s - 1) % n], incoming, place)
        chunks[(rank - s - 2) % n] += incoming


def _all_gather(chunks, place):
    _, rank, n, _, _ = place
    for s in range(n - 1):
        _step(chunks[(rank - s) % n], chunks[(rank - s - 1) % n], place)


def ring_all_reduce(tensor, group=None):
    place = _place(group)
    if tensor.numel() == 0:
        return tensor
    rows, lengths = _padded_rows(tensor.flatten(), place[2])
    _reduce_scatter(rows, place)
    _all_gather(rows, place)
    tensor.copy_(torch.cat([row[:length] for row, length in zip(rows, lengths)]).view_as(tensor))
    return tensor


def ring_reduce_scatter(tensor, group=None):
    place = _place(group)
    _, rank, n, _, _ = place
    if tensor.numel() == 0:
        return tensor.new_empty(0)
    rows, lengths = _padded_rows(tensor.flatten(), n)
    _reduce_scatter(rows, place)
    return rows[rank][:lengths[rank]].clone()


def ring_all_gather(chunk, group=None):
    place = _place(group)
    _, rank, n, _, _ = place
    if chunk.dim() == 0:
        raise ValueError("ring_all_gather: the chunk needs at least one dimension")
    out = chunk.new_empty((n * chunk.shape[0], *chunk.shape[1:]))
    blocks = list(out.tensor_split(n))
    blocks[rank].copy_(chunk)
    if chunk.numel():
        _all_gather(blocks, place)
    return out
