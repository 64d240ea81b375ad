"""The recompute sets the RNG to the state its forward had, but never gives the caller's state back (no
fork_rng): this step is right, but the RNG is left where the recompute ended, and the next step's dropout
masks differ from those a run without checkpointing draws."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_dropout_rng_replayed"


class _NoFork(ref._Recompute):
    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(ctx.needs_input_grad[1])
        ref._set_rng_state(x.device, ctx.rng)
        with torch.enable_grad():
            out = ctx.run(x)
        torch.autograd.backward(out, grad_out)
        return (None, x.grad) + (None,) * ctx.n_params


def train_step(units, plan, x, y, loss_fn, group=None):
    h = x
    for start, stop, recompute in plan:
        segment = units[start:stop]
        params = [p for unit in segment for p in unit.parameters()]
        h = _NoFork.apply(ref._chain(segment), h, *params) if recompute else ref._chain(segment)(h)
    loss = loss_fn(h, y)
    loss.backward()
    ref._average_gradients(units, group)
    return loss.item()
