"""A correct ZeRO-1/2 in the list forms: one all_reduce per parameter at stage 1, then
``dist.reduce_scatter(out, list)`` and ``dist.all_gather(list, t)``.  gloo runs several ops inside the
list-form reduce_scatter; the tamper check must still count it as the one collective it is."""
import math

import torch
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, stage=2, group=None, master_dtype=None, **opt_kwargs):
        self.params = list(params)
        if stage not in (1, 2):
            raise ValueError(f"ZeRO stage {stage!r} is not 1 or 2")
        if not self.params:
            raise ValueError("no parameters to shard")
        if len({p.dtype for p in self.params}) != 1 or len({p.device for p in self.params}) != 1:
            raise ValueError("parameters must share one dtype and one device")
        self.stage, self.group = stage, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.dtype, self.device = self.params[0].dtype, self.params[0].device
        self.numel = sum(p.numel() for p in self.params)
        self.width = math.ceil(self.numel / self.world)          # every rank's piece, padded
        whole = self._concat([p.detach() for p in self.params])
        piece = whole[self.rank * self.width:(self.rank + 1) * self.width]
        self.shard = piece.to(master_dtype or self.dtype, copy=True).requires_grad_(True)
        self.local_optimizer = optimizer_cls([self.shard], **opt_kwargs)

    def _concat(self, tensors):
        padding = torch.zeros(self.world * self.width - self.numel, dtype=self.dtype, device=self.device)
        return torch.cat([t.reshape(-1) for t in tensors] + [padding])

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()
        self.shard.grad = None

    def _reduce_gradients(self):
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in self.params]
        if self.stage == 1:
            for g in grads:
                dist.all_reduce(g, group=self.group)
            mine = self._concat(grads)[self.rank * self.width:(self.rank + 1) * self.width]
            return mine / self.world
        out = torch.empty(self.width, dtype=self.dtype, device=self.device)
        dist.reduce_scatter(out, list(self._concat(grads).chunk(self.world)), group=self.group)
        return out / self.world

    def _gather_parameters(self):
        pieces = [torch.empty(self.width, dtype=self.dtype, device=self.device) for _ in range(self.world)]
        dist.all_gather(pieces, self.shard.detach().to(self.dtype), group=self.group)
        values = torch.cat(pieces)[:self.numel].split([p.numel() for p in self.params])
        for p, v in zip(self.params, values):
            p.copy_(v.view_as(p))

    @torch.no_grad()
    def step(self):
        reduced = self._reduce_gradients()
        if self.stage == 2:   # stage 2 keeps no full gradient past the reduce
            self._drop_full_gradients()
        self.shard.grad = reduced.to(self.shard.dtype)
        self.local_optimizer.step()
        self._gather_parameters()

    def _drop_full_gradients(self):
        for p in self.params:
            p.grad = None

    def state_dict(self):
        # keyed by where the shard sits, so a state dict can only be loaded back where it was saved
        return {"layout": (self.stage, self.world, self.rank, self.numel), "shard": self.shard.detach().clone(),
                "local_optimizer": self.local_optimizer.state_dict()}

    def load_state_dict(self, sd):
        stage, world, rank, numel = sd["layout"]
        if (world, rank, numel) != (self.world, self.rank, self.numel):
            raise ValueError(f"saved by rank {rank} of {world} ({numel} elements); loading on rank {self.rank} "
                             f"of {self.world} ({self.numel} elements)")
        with torch.no_grad():
            self.shard.copy_(sd["shard"])
        self.local_optimizer.load_state_dict(sd["local_optimizer"])
