"""GradScaler's own kernels: torch._amp_foreach_non_finite_check_and_unscale_ unscales and checks each
(device, dtype) group of gradients in one fused call, the flag is SUM-reduced, and torch._amp_update_scale_ keeps
the scale and the growth tracker as tensors."""
import torch
import torch.distributed as dist

import harness


class DistributedLossScaler:
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, group=None):
        where = harness.device()
        self._scale = torch.full((1,), float(init_scale), dtype=torch.float32, device=where)
        self._tracker = torch.zeros(1, dtype=torch.int32, device=where)
        self._factors = (growth_factor, backoff_factor, growth_interval)
        self._group = group
        self._found = None

    def get_scale(self):
        return self._scale.item()

    def scale(self, loss):
        return loss * self._scale.to(loss.dtype)

    def unscale_(self, optimizer):
        if self._found is not None:
            raise RuntimeError("unscale_ twice in one step")
        found = torch.zeros(1, dtype=torch.float32, device=self._scale.device)
        inv = self._scale.double().reciprocal().float()
        by_kind = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    by_kind.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        for grads in by_kind.values():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv.to(grads[0].device))
        dist.all_reduce(found, group=self._group)
        self._found = found

    def step(self, optimizer):
        if self._found is None:
            self.unscale_(optimizer)
        return optimizer.step() if self._found.item() == 0 else None

    def update(self):
        growth, backoff, interval = self._factors
        torch._amp_update_scale_(self._scale, self._tracker, (self._found > 0).float(), growth, backoff, interval)
        self._found = None
