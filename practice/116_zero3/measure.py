"""Print your FullyShardedModel's measured memory and traffic beside ZeRO-3's formulas.

    python practice/116_zero3/measure.py              # your zero3.py
    python practice/116_zero3/measure.py --solution   # the reference, for comparison

Adam on a float32 MLP of Phi parameters.  Measured on rank 0: the bytes of parameters,
gradients and optimizer state it holds after a step (from the tensors themselves), the largest
number of full parameter bytes held at once during forward and backward (from hooks on the
units: with prefetch, the computing unit's and the next one's), and the bytes each collective
carried (from the harness's trace), in float32 and with compute_dtype=torch.bfloat16.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import harness  # noqa: E402
from kit.target_cli import target_from_command_line  # noqa: E402
from testkit.flat_shards import ring_wire_bytes  # noqa: E402
from testkit.models import mse, random_mlp  # noqa: E402

WIDTHS = [64, 96, 96, 10]


def _full_bytes(units):
    """Bytes of the distinct storages behind the units' tensor attributes (parameters or plain tensors)."""
    storages = {}
    for u in units:
        for t in list(vars(u).values()) + list(u._parameters.values()):
            if isinstance(t, torch.Tensor):
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def _measure(target, compute_dtype=None):
    model = random_mlp(WIDTHS, 0, dtype=torch.float32)
    units = list(model)
    options = {} if compute_dtype is None else {"compute_dtype": compute_dtype}
    fsdp = target.load().FullyShardedModel(model, **options)
    opt = torch.optim.Adam(fsdp.parameters(), lr=1e-3)
    peak = [0]
    for u in units:
        u.register_forward_pre_hook(lambda *a: peak.__setitem__(0, max(peak[0], _full_bytes(units))))
        u.register_full_backward_hook(lambda *a: peak.__setitem__(0, max(peak[0], _full_bytes(units))))
    x = torch.randn(8, WIDTHS[0])
    with harness.phase("step"):
        opt.zero_grad()
        mse(fsdp(x).float(), torch.zeros(8, WIDTHS[-1])).backward()
        opt.step()
    params = list(fsdp.parameters())
    return {"params": sum(p.numel() * p.element_size() for p in params),
            "grads": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
            "optimizer": sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                             if isinstance(v, torch.Tensor) and v.dim() > 0),
            "peak_full": peak[0], "world": dist.get_world_size()}


def main():
    target = target_from_command_line(116, __doc__.split("\n")[0])
    model = random_mlp(WIDTHS, 0)
    phi = sum(p.numel() for p in model.parameters())
    sizes = [n for n in (sum(p.numel() for p in child.parameters()) for child in model) if n]
    pair = max(a + b for a, b in zip(sizes, sizes[1:] + [0]))
    print(f"Phi = {phi} float32 parameters (largest two adjacent units {pair}); bytes on rank 0 "
          "(measured / formula)\n")
    print(f"{'N':>2} {'compute':>8} | {'params':>15} {'grads':>15} {'adam state':>15} {'peak full':>15} | "
          f"{'ring wire per step':>19}")
    for n in (1, 2, 4):
        for compute, e in ((None, 4), (torch.bfloat16, 2)):
            result = harness.run(_measure, n, target, compute, timeout=60)
            m = result.values[0]
            formula = {"params": 4 * phi / n, "grads": 4 * phi / n, "optimizer": 8 * phi / n,
                       "peak_full": e * pair}
            wire = sum(ring_wire_bytes(op.kind, op.in_bytes, n) for op in result.trace.ops(0, phase="step"))
            cells = " ".join(f"{m[k]:>7.0f}/{formula[k]:<7.0f}" for k in formula)
            name = "float32" if compute is None else "bf16"
            print(f"{n:>2} {name:>8} | {cells} | {wire:>8.0f}/{(n - 1) / n * (2 * e + 4) * phi:<10.0f}")
    print("\nformulas (bytes, float32 shards): shards 4Phi/N, their gradients 4Phi/N, Adam's exp_avg + exp_avg_sq\n"
          "8Phi/N; with prefetch at most two adjacent units' full parameters exist at a time (e_c x their P, the\n"
          "largest adjacent pair at the peak; e_c = 4 in float32, 2 in bf16); per step 2 all_gathers (e_c bytes\n"
          "an element) + 1 reduce_scatter (4 bytes) per unit: (N-1)/N x (2e_c + 4) x Phi on a ring: 1.5x DDP in\n"
          "float32, 1x with bf16 compute.  Padding makes the shards ceil(P_u/N) per unit, a little above Phi/N.\n"
          "In all, ZeRO-3's 16Phi/N: (4 + 4 + 8) bytes per parameter, all divided by N.")


if __name__ == "__main__":
    try:
        main()
    except (harness.HarnessError, harness.NotImplementedYet) as e:   # say it plainly, without a traceback
        sys.exit(f"{type(e).__name__}: {e}")
