"""A ring built from blocking dist.send / dist.recv, ordered even/odd, with chunks kept as separate tensors.

Even ranks send first and then receive; odd ranks receive first.  Rank 0 always sends first, so the chain of
waits always ends (with N odd, ranks N-1 and 0 are both even: N-1 waits until rank 0 has finished sending).
The chunks are clones in a Python list, not views of one flat tensor, and the result is torch.cat of them;
the all-gather forwards, at each step, the block it has just received.
"""
import torch
import torch.distributed as dist


class Ring:
    def __init__(self, group):
        self.group = group or dist.group.WORLD
        self.rank, self.n = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.right = dist.get_global_rank(self.group, (self.rank + 1) % self.n)
        self.left = dist.get_global_rank(self.group, (self.rank - 1) % self.n)

    def pass_on(self, outgoing, incoming_like):
        """Send ``outgoing`` to the right, receive a tensor like ``incoming_like`` from the left, blocking."""
        incoming = torch.empty_like(incoming_like)
        if self.rank % 2 == 0:
            self._send(outgoing)
            self._recv(incoming)
        else:
            self._recv(incoming)
            self._send(outgoing)
        return incoming

    def _send(self, t):
        if t.numel():
            dist.send(t.contiguous(), self.right, group=self.group)

    def _recv(self, t):
        if t.numel():
            dist.recv(t, self.left, group=self.group)


def _reduce_scatter(chunks, ring):
    for s in range(ring.n - 1):
        into = (ring.rank - s - 2) % ring.n
        chunks[into] = chunks[into] + ring.pass_on(chunks[(ring.rank - s - 1) % ring.n], chunks[into])


def _all_gather(chunks, ring):
    for s in range(ring.n - 1):
        into = (ring.rank - s - 1) % ring.n
        chunks[into] = ring.pass_on(chunks[(ring.rank - s) % ring.n], chunks[into])


def _chunks(tensor, n):
    return [c.clone() for c in tensor.flatten().tensor_split(n)]


def ring_all_reduce(tensor, group=None):
    ring = Ring(group)
    chunks = _chunks(tensor, ring.n)
    _reduce_scatter(chunks, ring)
    _all_gather(chunks, ring)
    tensor.copy_(torch.cat(chunks).view_as(tensor))
    return tensor


def ring_reduce_scatter(tensor, group=None):
    ring = Ring(group)
    chunks = _chunks(tensor, ring.n)
    _reduce_scatter(chunks, ring)
    return chunks[ring.rank]


def ring_all_gather(chunk, group=None):
    if chunk.dim() == 0:
        raise ValueError("ring_all_gather needs a chunk with at least one dimension")
    ring = Ring(group)
    blocks = [torch.empty_like(chunk) for _ in range(ring.n)]
    blocks[ring.rank] = chunk.clone()
    _all_gather(blocks, ring)
    return torch.cat(blocks)
