"""The exchange's backward forgets the group it saved and sends the gradient over the default group: right for
Ulysses on every rank, wrong inside the Ulysses groups of a USP grid with R > 1."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_usp_gradients_match_full_attention"


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, there, back):
        ctx.back = back
        return there(x, group)

    @staticmethod
    def backward(ctx, grad):
        return ctx.back(grad.contiguous(), None), None, None, None


class DefaultGroupBackward(ref.Ulysses):
    def __call__(self, q, k, v, causal, group, ring_group=None, what="ulysses_attention"):
        self.check_heads(q.shape[1], self.size(group), what)
        qkv = _Exchange.apply(torch.stack([q, k, v]), group, self.to_heads, self.to_seq)
        return _Exchange.apply(self.attend(*qkv.unbind(0), causal, ring_group), group, self.to_seq, self.to_heads)


def usp_attention(q, k, v, ulysses_group, ring_group, causal=False):
    return DefaultGroupBackward()(q, k, v, causal, ulysses_group, ring_group, what="usp_attention")
