"""Problem 127 reference: dynamic loss scaling whose skip decision is shared by every rank."""
from __future__ import annotations

import torch
import torch.distributed as dist

import harness


class DistributedLossScaler:
    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, group=None):
        if init_scale <= 0 or growth_factor <= 1 or not 0 < backoff_factor < 1 or growth_interval < 1:
            raise ValueError("need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1")
        self._scale = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.group = growth_interval, group
        self._clean_steps = 0          # consecutive steps without inf/NaN since the last growth or backoff
        self._found_inf = None         # None: not unscaled yet this step; else the group's decision

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale

    def unscale_(self, optimizer) -> None:
        if self._found_inf is not None:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self._found_inf = self._agree(self._unscale_and_check(grads))

    def _unscale_and_check(self, grads) -> torch.Tensor:
        """Divide each gradient by the scale in place; a flag: 1.0 if this rank sees inf, -inf or NaN, else 0.0."""
        flag = torch.zeros(1, device=harness.device())
        for g in grads:
            g.div_(self._scale)
            flag = torch.maximum(flag, (~torch.isfinite(g)).any().float())
        return flag

    def _agree(self, flag: torch.Tensor) -> bool:
        """One tiny all-reduce: an overflow on any rank of the group skips the step on every rank."""
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())

    def step(self, optimizer):
        if self._found_inf is None:
            self.unscale_(optimizer)
        if not self._found_inf:
            return optimizer.step()
        return None

    def update(self) -> None:
        if self._found_inf is None:
            raise RuntimeError("update() needs a step() (or unscale_()) first")
        if self._found_inf:
            self._scale *= self.backoff_factor
            self._clean_steps = 0
        else:
            self._clean_steps += 1
            if self._clean_steps == self.growth_interval:
                self._scale *= self.growth_factor
                self._clean_steps = 0
        self._found_inf = None
