"""Calls the two all_to_all directly, outside any autograd Function: the values are right, but a c10d
collective writes into a fresh buffer autograd knows nothing about, so no gradient can reach q, k and v."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_ulysses_gradients_match_full_attention"


class Plain(ref.Ulysses):
    def __call__(self, q, k, v, causal, group, ring_group=None, what="ulysses_attention"):
        self.check_heads(q.shape[1], self.size(group), what)
        qkv = self.to_heads(torch.stack([q, k, v]), group)
        return self.to_seq(self.attend(*qkv.unbind(0), causal, ring_group), group)


def ulysses_attention(q, k, v, causal=False, group=None):
    return Plain()(q, k, v, causal, group)


def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    return Plain()(q, k, v, causal, ulysses_group, ring_group, what="usp_attention")
