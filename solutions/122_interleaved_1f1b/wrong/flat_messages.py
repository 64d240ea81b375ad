"""run_interleaved sends every activation and gradient flattened to 1-D (and reshapes on receive), not as act_shape."""
import torch
import torch.distributed as dist

import harness
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_p2p_only_to_neighbouring_virtual_stages"


class _FlatRing(ref._Ring):
    def send(self, tensor, peer):
        super().send(tensor.reshape(-1), peer)

    def recv(self, peer):
        if self.alone:
            return super().recv(peer).reshape(self.shape)
        buffer = torch.empty(self.shape, dtype=self.dtype, device=harness.device()).reshape(-1)
        dist.recv(buffer, peer, group=self.group)
        return buffer.reshape(self.shape)


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    r, p = dist.get_rank(group), dist.get_world_size(group)
    ring = _FlatRing(group, act_shape, next(chunks[0].parameters()).dtype)
    return ref._run(chunks, schedule[r], microbatches, loss_fn, ring, r, p)
