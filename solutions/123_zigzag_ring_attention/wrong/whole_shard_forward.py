"""Forward keeps 119's whole-shard blocks (skipped only if all masked), which under zigzag never skip."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_zigzag_beats_the_contiguous_split"


class WholeShards(ZigzagAttention):
    def forward(self, ring, q, k, v):
        c, q_pos = q.shape[SEQ] // 2, self.positions(ring.rank, ring.size, q.shape[SEQ] // 2, q.device)
        state = (torch.zeros_like(q), q.new_full(q.shape[:-1] + (1,), float("-inf")), q.new_zeros(q.shape[:-1] + (1,)))
        for source, k, v in self.around(ring, k, v):
            mask = q_pos[:, None] >= self.positions(source, ring.size, c, q.device)[None, :]
            if self.needed(mask):
                state = self.fold(state, self.scores(q, k, mask), v)
        acc, m, l = state
        return acc / l, m + torch.log(l)


def zigzag_ring_attention(q, k, v, group=None):
    return WholeShards()(q, k, v, group)
