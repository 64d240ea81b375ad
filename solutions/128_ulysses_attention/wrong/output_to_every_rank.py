"""Sends the whole head-group output, every position, to every rank, which keeps its own rows: N times the M bytes back."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_two_all_to_alls_each_way"


class EverythingBack(ref.Ulysses):
    def to_seq(self, x, group):
        n, r = self.size(group), dist.get_rank(group)
        *lead, hn, s, d = x.shape
        send = x.unsqueeze(0).expand(n, *x.shape).contiguous()        # [N, ..., H/N, S, D]: all of it, to each
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=group)           # received[i]: rank i's heads, every position
        mine = received[..., r * (s // n):(r + 1) * (s // n), :]
        return mine.movedim(0, -4).reshape(*lead, n * hn, s // n, d)


def ulysses_attention(q, k, v, causal=False, group=None):
    return EverythingBack()(q, k, v, causal, group)


def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    return EverythingBack()(q, k, v, causal, ulysses_group, ring_group, what="usp_attention")
