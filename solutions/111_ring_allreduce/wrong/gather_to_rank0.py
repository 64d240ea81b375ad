"""Every rank sends its whole tensor to rank 0, which sums and sends the result back: a star, not a ring."""
import torch
import torch.distributed as dist

from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_ring_neighbours_only"


def ring_all_reduce(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for src in range(1, n):
            dist.recv(incoming, src)
            tensor += incoming
        for dst in range(1, n):
            dist.send(tensor, dst)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
    return tensor
