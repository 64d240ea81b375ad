"""The recompute does not restore the RNG state: the dropout in a recomputed segment draws new masks in
backward, so the gradients are those of another forward than the one whose loss was returned."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_dropout_rng_replayed"


class _NoReplay(ref._Recompute):
    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(ctx.needs_input_grad[1])
        with torch.enable_grad():
            out = ctx.run(x)
        torch.autograd.backward(out, grad_out)
        return (None, x.grad) + (None,) * ctx.n_params


def train_step(units, plan, x, y, loss_fn, group=None):
    h = x
    for start, stop, recompute in plan:
        segment = units[start:stop]
        params = [p for unit in segment for p in unit.parameters()]
        h = _NoReplay.apply(ref._chain(segment), h, *params) if recompute else ref._chain(segment)(h)
    loss = loss_fn(h, y)
    loss.backward()
    ref._average_gradients(units, group)
    return loss.item()
