"""The all-to-all's backward exchanges the split sizes again instead of reusing the forward's: one extra all_to_all."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_backward_mirrors_the_token_all_to_alls"


class Recounting(ref.AllToAll):
    @staticmethod
    def backward(ctx, grad):
        out_splits, _ = ctx.splits
        counts = torch.tensor(out_splits, device=grad.device)
        back = torch.empty_like(counts)
        dist.all_to_all_single(back, counts, group=ctx.group)   # what each rank sent us: the forward's in_splits
        return ref.all_to_all(grad, back.tolist(), out_splits, ctx.group), None, None, None


class Wrong(ref.MoE):
    def exchange(self, rows, out_splits, in_splits, group):
        return Recounting.apply(rows, out_splits, in_splits, group)


moe_forward = Wrong()
