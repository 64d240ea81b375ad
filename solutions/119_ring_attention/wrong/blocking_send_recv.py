"""Passes K and V with blocking send/recv (even ranks send first), so nothing overlaps with compute."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_forward_computes_while_the_next_chunk_travels"


class _Done:
    def wait(self):
        pass


class Blocking(ref.Ring):
    def pass_on(self, *tensors):
        received = [torch.empty_like(t) for t in tensors]
        for sending in ((True, False) if self.rank % 2 == 0 else (False, True)):
            for t, r in zip(tensors, received):
                if sending:
                    dist.send(t, self.next, group=self.group)
                else:
                    dist.recv(r, self.prev, group=self.group)
        return received, [_Done()]


class BlockingRing(ref.RingAttention):
    def ring(self, group):
        return Blocking(group)


ring_attention = BlockingRing()
