"""The recompute Function saves its output as well as its input ("backward will need it"): one more
activation held per recomputed segment, which the plan's budget has no room for."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_saved_bytes_within_budget"


class _KeepsOutput(ref._Recompute):
    @staticmethod
    def forward(ctx, run, x, *params):
        ctx.run, ctx.n_params, ctx.rng = run, len(params), ref._rng_state(x.device)
        out = run(x)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, _ = ctx.saved_tensors
        x = x.detach().requires_grad_(ctx.needs_input_grad[1])
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            ref._set_rng_state(x.device, ctx.rng)
            out = ctx.run(x)
        torch.autograd.backward(out, grad_out)
        return (None, x.grad) + (None,) * ctx.n_params


def train_step(units, plan, x, y, loss_fn, group=None):
    h = x
    for start, stop, recompute in plan:
        segment = units[start:stop]
        params = [p for unit in segment for p in unit.parameters()]
        h = _KeepsOutput.apply(ref._chain(segment), h, *params) if recompute else ref._chain(segment)(h)
    loss = loss_fn(h, y)
    loss.backward()
    ref._average_gradients(units, group)
    return loss.item()
