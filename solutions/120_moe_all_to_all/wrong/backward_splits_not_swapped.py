"""The all-to-all's backward reuses the forward's split sizes instead of swapping them."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_gradients_match_single_device"


class SameSplits(ref.AllToAll):
    @staticmethod
    def backward(ctx, grad):
        return ref.all_to_all(grad, *ctx.splits, ctx.group), None, None, None


class Wrong(ref.MoE):
    def exchange(self, rows, out_splits, in_splits, group):
        return SameSplits.apply(rows, out_splits, in_splits, group)


moe_forward = Wrong()
