"""Problem 115 reference: ZeRO stage 1/2, an optimizer whose state (and gradients) are sharded over ranks."""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, stage=2, group=None, master_dtype=None, **opt_kwargs):
        self.params = list(params)
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, got {stage!r}")
        if not self.params:
            raise ValueError("ShardedOptimizer got an empty parameter list")
        dtypes, devices = sorted({str(p.dtype) for p in self.params}), sorted({str(p.device) for p in self.params})
        if len(dtypes) > 1:
            raise ValueError(f"all parameters must share one dtype, got {dtypes}")
        if len(devices) > 1:
            raise ValueError(f"all parameters must be on one device, got {devices}")
        self.stage, self.group = stage, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.dtype = self.params[0].dtype
        self.master_dtype = master_dtype or self.dtype
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = self._shard_size(self.numel, self.world)
        own = self._flatten([p.detach() for p in self.params])[self._own]
        self.shard = own.to(self.master_dtype, copy=True).requires_grad_(True)
        self.local_optimizer = optimizer_cls([self.shard], **opt_kwargs)

    @staticmethod
    def _shard_size(numel, world):
        return math.ceil(numel / world)

    @property
    def _own(self):
        return slice(self.rank * self.shard_size, (self.rank + 1) * self.shard_size)

    def _flatten(self, tensors):
        """One vector of N*S elements: every tensor flattened, in order, then zero padding."""
        flat = torch.zeros(self.world * self.shard_size, dtype=self.dtype, device=self.params[0].device)
        offset = 0
        for t in tensors:
            flat[offset:offset + t.numel()] = t.reshape(-1)
            offset += t.numel()
        return flat

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        self.shard.grad = None

    def _reduce_gradients(self):
        """This rank's slice of the gradient, averaged over ranks, in the parameters' dtype."""
        flat = self._flatten([torch.zeros_like(p) if p.grad is None else p.grad for p in self.params])
        if self.stage == 1:
            dist.all_reduce(flat, group=self.group)
            grad = flat[self._own]
        else:
            grad = torch.empty_like(flat[self._own])
            dist.reduce_scatter_tensor(grad, flat, group=self.group)
        return grad / self.world

    def _gather_parameters(self):
        """All-gather every rank's updated slice (cast to the parameters' dtype) and write them into the params."""
        full = torch.empty(self.world * self.shard_size, dtype=self.dtype, device=self.shard.device)
        dist.all_gather_into_tensor(full, self.shard.detach().to(self.dtype), group=self.group)
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    @torch.no_grad()
    def step(self):
        self.shard.grad = self._reduce_gradients().to(self.master_dtype)
        if self.stage == 2:   # the full gradients are not kept: only the shard's slice survives
            for p in self.params:
                p.grad = None
        self.local_optimizer.step()
        self._gather_parameters()

    def state_dict(self):
        """This rank's part: its master shard and its local optimizer's state."""
        return {"stage": self.stage, "world_size": self.world, "rank": self.rank, "numel": self.numel,
                "shard": self.shard.detach().clone(), "local_optimizer": self.local_optimizer.state_dict()}

    def load_state_dict(self, sd):
        expected = (self.world, self.rank, self.numel)
        if (sd["world_size"], sd["rank"], sd["numel"]) != expected:
            raise ValueError(f"state dict was saved by rank {sd['rank']} of {sd['world_size']} over {sd['numel']} "
                             f"elements; this is rank {self.rank} of {self.world} over {self.numel}")
        with torch.no_grad():
            self.shard.copy_(sd["shard"])
        self.local_optimizer.load_state_dict(sd["local_optimizer"])
