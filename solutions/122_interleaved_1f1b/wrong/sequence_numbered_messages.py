"""Every message carries a sequence number after the tensor, so the receiver can check that nothing arrives out of
order: right values and as many messages, but each one element longer than act_shape, which the order already
guarantees."""
import math
from collections import Counter

import torch
import torch.distributed as dist

import harness
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_p2p_only_to_neighbouring_virtual_stages"


class _NumberedRing(ref._Ring):
    def __init__(self, group, act_shape, dtype):
        super().__init__(group, act_shape, dtype)
        self.sent, self.received = Counter(), Counter()

    def send(self, tensor, peer):
        if self.alone:
            return super().send(tensor, peer)
        number = tensor.new_tensor([self.sent[peer]])
        self.sent[peer] += 1
        super().send(torch.cat([tensor.detach().reshape(-1), number]), peer)

    def recv(self, peer):
        if self.alone:
            return super().recv(peer)
        buffer = torch.empty(math.prod(self.shape) + 1, dtype=self.dtype, device=harness.device())
        dist.recv(buffer, peer, group=self.group)
        assert int(buffer[-1]) == self.received[peer], "a message arrived out of order"
        self.received[peer] += 1
        return buffer[:-1].reshape(self.shape)


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    r, p = dist.get_rank(group), dist.get_world_size(group)
    ring = _NumberedRing(group, act_shape, next(chunks[0].parameters()).dtype)
    return ref._run(chunks, schedule[r], microbatches, loss_fn, ring, r, p)
