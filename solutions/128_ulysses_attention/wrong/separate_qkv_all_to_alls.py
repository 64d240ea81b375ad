"""Exchanges q, k and v with an all_to_all each, as DeepSpeed-Ulysses does, then the output: four all_to_all per
forward (and four in backward) where one for q, k, v together and one back are enough."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_two_all_to_alls_each_way"


class ThreeExchanges(ref.Ulysses):
    def __call__(self, q, k, v, causal, group, ring_group=None, what="ulysses_attention"):
        self.check_heads(q.shape[1], self.size(group), what)
        qh, kh, vh = (ref._Exchange.apply(t, group, self.to_heads, self.to_seq) for t in (q, k, v))
        return ref._Exchange.apply(self.attend(qh, kh, vh, causal, ring_group), group, self.to_seq, self.to_heads)


def ulysses_attention(q, k, v, causal=False, group=None):
    return ThreeExchanges()(q, k, v, causal, group)


def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    return ThreeExchanges()(q, k, v, causal, ulysses_group, ring_group, what="usp_attention")
