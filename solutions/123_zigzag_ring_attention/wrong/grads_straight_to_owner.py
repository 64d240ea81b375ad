"""Backward sends each shard's dK, dV partials straight to the shard's owner, not along the ring with it."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_backward_passes_shards_between_neighbours"


class StraightHome(ZigzagAttention):
    def backward(self, ring, q, k, v, out, lse, dout):
        delta = (dout * out).sum(-1, keepdim=True)
        dq, owed = torch.zeros_like(q), {}
        for source, k_held, v_held in self.around(ring, k, v):
            dk, dv = torch.zeros_like(k), torch.zeros_like(v)
            self.add_block_grads(ring, source, (q, lse, dout, delta, dq), (k_held, v_held, dk, dv))
            owed[source] = dk, dv
        dk, dv = owed.pop(ring.rank)
        glob = (lambda i: i) if ring.group is None else (lambda i: dist.get_global_rank(ring.group, i))
        works, inbox = [], []
        for source, (pk, pv) in owed.items():          # the owner, however far round the ring
            inbox += [torch.empty_like(pk), torch.empty_like(pv)]
            works += [dist.isend(pk, glob(source), group=ring.group), dist.isend(pv, glob(source), group=ring.group),
                      dist.irecv(inbox[-2], glob(source), group=ring.group),
                      dist.irecv(inbox[-1], glob(source), group=ring.group)]
        for work in works:
            work.wait()
        return dq, dk + sum(inbox[0::2], torch.zeros_like(dk)), dv + sum(inbox[1::2], torch.zeros_like(dv))


def zigzag_ring_attention(q, k, v, group=None):
    return StraightHome()(q, k, v, group)
