"""Keeps every (micro-batch, chunk)'s graph until the step ends: each B reads what its F kept without letting
go of it, and backwards with retain_graph=True "in case".  Gradients, losses and messages are all right, but
every activation a forward saved stays alive to the end of the step: the peak is all m*v forwards, not the
schedule's."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_activations_are_freed_by_their_backward"


class _KeptToTheEnd(ref._Kept):
    def backward(self, key, grad=None):
        x, out = self[key]                        # left in the dict, which goes only when the step ends
        out.backward(grad, retain_graph=True)     # so the graph, and all it saved, stays with it
        return x


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    r, p = dist.get_rank(group), dist.get_world_size(group)
    ring = ref._Ring(group, act_shape, next(chunks[0].parameters()).dtype)
    return ref._run(chunks, schedule[r], microbatches, loss_fn, ring, r, p, kept=_KeptToTheEnd())
