"""A correct but unusual ZeRO stage 1/2: every rank's master shard, local optimizer and gradient buffer live
in a module-level dict, not on the object; the object keeps only an id.  The memory test must find them there,
and count them at their true (sharded) size."""
import math
import weakref

import torch
import torch.distributed as dist

_STATE = {}   # id(optimizer) -> {"shard", "optimizer", "grad"}; dropped when the optimizer object dies


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, stage=2, group=None, master_dtype=None, **opt_kwargs):
        params = list(params)
        if stage not in (1, 2):
            raise ValueError(f"unknown ZeRO stage {stage}; this optimizer implements stage 1 and stage 2")
        if len({p.dtype for p in params}) > 1:
            raise ValueError(f"params of more than one dtype: {sorted({str(p.dtype) for p in params})}")
        if len({p.device for p in params}) > 1:
            raise ValueError(f"params on more than one device: {sorted({str(p.device) for p in params})}")
        self._params, self._stage, self._group = params, stage, group
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        numel = sum(p.numel() for p in params)
        self._s = math.ceil(numel / world)
        self._lo = rank * self._s
        master = master_dtype or params[0].dtype
        # only this rank's slice is ever materialised: copied element range by element range from the params
        shard = torch.zeros(self._s, dtype=master, device=params[0].device)
        offset = 0
        for p in params:
            lo, hi = max(offset, self._lo), min(offset + p.numel(), self._lo + self._s)
            if lo < hi:
                shard[lo - self._lo:hi - self._lo] = p.detach().reshape(-1)[lo - offset:hi - offset]
            offset += p.numel()
        shard.requires_grad_(True)
        key = id(self)
        _STATE[key] = {"shard": shard, "optimizer": optimizer_cls([shard], **opt_kwargs),
                       "grad": torch.zeros_like(shard)}   # reused every step
        weakref.finalize(self, _STATE.pop, key, None)

    @property
    def _mine(self):
        return _STATE[id(self)]

    @property
    def local_optimizer(self):
        return self._mine["optimizer"]

    def zero_grad(self, set_to_none=True):
        for p in self._params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        self._mine["shard"].grad = None

    def _flat(self, tensors):
        world = dist.get_world_size(self._group)
        return torch.cat([t.reshape(-1) for t in tensors] +
                         [tensors[0].new_zeros(world * self._s - sum(t.numel() for t in tensors))])

    @torch.no_grad()
    def step(self):
        world = dist.get_world_size(self._group)
        flat = self._flat([torch.zeros_like(p) if p.grad is None else p.grad for p in self._params])
        if self._stage == 1:
            dist.all_reduce(flat, group=self._group)
            mine = flat[self._lo:self._lo + self._s]
        else:
            mine = flat.new_empty(self._s)
            dist.reduce_scatter_tensor(mine, flat, group=self._group)
            for p in self._params:
                p.grad = None
        state = self._mine
        state["grad"].copy_(mine / world)
        state["shard"].grad = state["grad"]
        state["optimizer"].step()
        gathered = flat.new_empty(world * self._s)
        dist.all_gather_into_tensor(gathered, state["shard"].detach().to(flat.dtype), group=self._group)
        offset = 0
        for p in self._params:
            p.copy_(gathered[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def state_dict(self):
        state = self._mine
        return {"shard": state["shard"].detach().clone(), "optimizer": state["optimizer"].state_dict()}

    def load_state_dict(self, sd):
        state = self._mine
        with torch.no_grad():
            state["shard"].copy_(sd["shard"])
        state["optimizer"].load_state_dict(sd["optimizer"])
