"""A float64 tensor scale, multiply-by-inverse unscaling, one SUM-reduced overflow count per parameter tensor, and a state
machine instead of a None flag: every property holds all the same."""
import torch
import torch.distributed as dist


class DistributedLossScaler:
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, group=None):
        self.s = torch.tensor(float(init_scale), dtype=torch.float64)
        self.g, self.b, self.i, self.group = growth_factor, backoff_factor, growth_interval, group
        self.n, self.state = 0, "ready"
        self.flags = None

    def get_scale(self):
        return float(self.s)

    def scale(self, loss):
        return loss * self.s.to(loss.dtype)

    def unscale_(self, optimizer):
        if self.state != "ready":
            raise RuntimeError("twice")
        inv = (1.0 / self.s).float()
        flags = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(inv)
                    flags.append(torch.logical_not(torch.isfinite(p.grad)).sum().reshape(1).float())
        flags = torch.cat(flags)
        dist.all_reduce(flags, group=self.group)   # SUM, one element per parameter tensor
        self.flags = flags
        self.state = "unscaled"

    def step(self, optimizer, *args):
        if self.state == "ready":
            self.unscale_(optimizer)
        self.state = "stepped"
        if self.flags.sum() == 0:
            return optimizer.step(*args)

    def update(self):
        if self.flags.sum() > 0:
            self.s = self.s * self.b
            self.n = 0
        else:
            self.n += 1
            if self.n >= self.i:
                self.s, self.n = self.s * self.g, 0
        self.state = "ready"
