"""Moves every rank's tensor through the rendezvous store and sums it there; the ring carries zeros.

The decoy messages have the right sizes, peers and order, so the trace looks like a ring all-reduce, and the
sum (taken in rank order on every rank) is right and bitwise identical.  Only a test that changes a message
and watches the result can tell that the messages decide nothing.
"""
import io

import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_all_reduce_depends_on_its_messages"


def _pack(t):
    buffer = io.BytesIO()
    torch.save(t, buffer)
    return buffer.getvalue()


def ring_all_reduce(tensor, group=None):
    ring = ref._Ring(group)
    store = dist.distributed_c10d._get_default_store()
    me = dist.get_global_rank(ring.group, ring.rank)
    members = [dist.get_global_rank(ring.group, i) for i in range(ring.n)]
    call = f"side/{members}/" + str(store.add(f"side/{members}/calls/{me}", 1))   # the group's members agree
    store.set(f"{call}/{me}", _pack(tensor.flatten().clone()))
    decoy = list(torch.zeros_like(tensor.flatten()).tensor_split(ring.n))
    ref._reduce_scatter_phase(decoy, ring)
    ref._all_gather_phase(decoy, ring)
    flats = [torch.load(io.BytesIO(store.get(f"{call}/{r}"))) for r in members]
    total = flats[0].clone()
    for flat in flats[1:]:
        total += flat
    tensor.copy_(total.view_as(tensor))
    return tensor
