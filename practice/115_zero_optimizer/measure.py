"""Print your ShardedOptimizer's measured memory and traffic beside ZeRO's formulas.

    python practice/115_zero_optimizer/measure.py              # your zero.py
    python practice/115_zero_optimizer/measure.py --solution   # the reference, for comparison

Mixed-precision Adam on a bfloat16 MLP with a float32 master: Phi parameters, 2 bytes each.
Measured on the ranks: the params, the gradients still held after step(), the master shard and
the optimizer state (every other tensor storage alive in the rank that construction and step()
left behind, wherever it is kept: harness.memory), and the bytes each collective carried (from
the harness's trace).  Padding makes the measured shard S = ceil(Phi/N), a little above Phi/N.
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


def _measure(target, stage):
    model = random_mlp(WIDTHS, 0, dtype=torch.bfloat16)
    x = torch.randn(8, WIDTHS[0], dtype=torch.bfloat16, device=harness.device())
    y = torch.zeros(8, WIDTHS[-1], dtype=torch.bfloat16, device=harness.device())
    before = harness.live_storages(collect=False)
    opt = target.load().ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=stage,
                                         master_dtype=torch.float32, lr=1e-3)
    opt.zero_grad()
    mse(model(x), y).backward()
    with harness.phase("step"):
        opt.step()
    params = list(model.parameters())
    local = [p for g in opt.local_optimizer.param_groups for p in g["params"]]
    grads = [p.grad for p in params + local if p.grad is not None]
    # everything else step() left alive: the master shard and the optimizer state, wherever they are kept
    optimizer = harness.live_tensor_bytes(exclude=[before, params, grads])
    return {"params": sum(p.numel() * p.element_size() for p in params),
            "grads": sum(g.numel() * g.element_size() for g in grads),
            "optimizer": optimizer, "world": dist.get_world_size()}


def main():
    target = target_from_command_line(115, __doc__.split("\n")[0])
    phi = sum(p.numel() for p in random_mlp(WIDTHS, 0).parameters())
    print(f"Phi = {phi} parameters; bytes per rank (measured / formula)\n")
    print(f"{'stage':>5} {'N':>2} | {'params':>15} {'grads':>15} {'optimizer':>15} {'total':>15} | "
          f"{'sent per step':>13} {'ring wire':>19}")
    for stage in (1, 2):
        for n in (1, 2, 4):
            result = harness.run(_measure, n, target, stage, timeout=60)
            m = result.values[0]
            formula = {"params": 2 * phi, "grads": (2 * phi if stage == 1 else 0) + 4 * phi / n,
                       "optimizer": 12 * phi / n}
            ring = (3 if stage == 1 else 2) * (n - 1) / n * 2 * phi
            total = sum(m[k] for k in formula), sum(formula.values())
            ops = result.trace.ops(0, phase="step")
            sent = sum(op.in_bytes for op in ops)
            wire = sum(ring_wire_bytes(op.kind, op.in_bytes, n) for op in ops)
            cells = [f"{m[k]:>7.0f}/{formula[k]:<7.0f}" for k in formula] + [f"{total[0]:>7.0f}/{total[1]:<7.0f}"]
            print(f"{stage:>5} {n:>2} | {' '.join(cells)} | {sent:>13} {wire:>8.0f}/{ring:<10.0f}")
    print("\nformulas (bytes): params 2Phi (bfloat16, replicated); grads: stage 1 keeps the full bfloat16\n"
          "gradient (2Phi) and both stages keep the shard's float32 gradient (4Phi/N); optimizer: float32\n"
          "master + exp_avg + exp_avg_sq = 12Phi/N.  The paper's 4Phi + 12Phi/N and 2Phi + 14Phi/N count the\n"
          "shard's gradient in 16-bit and leave it out at stage 1.  Ring wire per step: stage 1 all_reduce +\n"
          "all_gather = 3(N-1)/N x 2Phi; stage 2 reduce_scatter + all_gather = 2(N-1)/N x 2Phi, as DDP.")


if __name__ == "__main__":
    try:
        main()
    except (harness.HarnessError, harness.NotImplementedYet) as e:   # say it plainly, without a traceback
        sys.exit(f"{type(e).__name__}: {e}")
