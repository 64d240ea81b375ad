"""Problem 116 reference: ZeRO-3, every unit's parameters held as a flat 1/N shard and gathered only while used.

Each unit's all_gather is issued one unit ahead (prefetch), so it travels while the unit before it computes;
with ``compute_dtype`` the units compute in that dtype from shards kept in their own (master) dtype.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn


def _set_tensor(module: nn.Module, name: str, value: torch.Tensor):
    owner, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner) if owner else module
    owner._parameters.pop(attr, None)
    setattr(owner, attr, value)


class _Unit:
    """One child of the Sequential: the layout of its flattened parameters and the full buffer while gathered."""

    def __init__(self, index, module):
        self.index, self.module = index, module
        named = list(module.named_parameters())
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numel = sum(p.numel() for _, p in named)
        self.shard_size = 0
        self.shard = self.full = None
        self.pending = None                 # (work, input) of an all_gather in flight into ``full``
        self.prev = self.next = None        # the neighbouring units with parameters, in forward order


class FullyShardedModel(nn.Module):
    def __init__(self, module: nn.Sequential, group=None, compute_dtype=None):
        super().__init__()
        self.group, self.compute_dtype = group, compute_dtype
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self._keys = list(module.state_dict().keys())
        self.shards = nn.ParameterList()
        self._units = []
        for i, child in enumerate(module):
            unit = _Unit(i, child)
            if unit.numel == 0:
                continue
            unit.shard_size = self._shard_size(unit.numel, self.world)
            flat = self._flatten(unit, [p.detach() for p in child.parameters()])
            s = unit.shard_size
            self.shards.append(nn.Parameter(flat[self.rank * s:(self.rank + 1) * s].clone()))
            unit.shard = self.shards[-1]
            self._bind(unit, flat)
            self._free(unit)
            child.register_forward_pre_hook(lambda m, args, unit=unit: self._before_forward(unit))
            child.register_forward_hook(lambda m, args, out, unit=unit: self._after_forward(unit, out))
            self._units.append(unit)
        for before, after in zip(self._units, self._units[1:]):
            before.next, after.prev = after, before
        self.module = module    # registered after its parameters left: parameters() are the shards only

    @staticmethod
    def _shard_size(numel, world):
        return math.ceil(numel / world)

    def _flatten(self, unit, tensors):
        flat = torch.zeros(self.world * unit.shard_size, dtype=tensors[0].dtype, device=tensors[0].device)
        flat[:unit.numel] = torch.cat([t.reshape(-1) for t in tensors])
        return flat

    def _dtype(self, unit):
        """What the unit computes in: compute_dtype, else its shard's own dtype."""
        return self.compute_dtype or unit.shard.dtype

    # ---- gathering, one unit ahead ----------------------------------------------------------------

    def _issue_gather(self, unit, out):
        """Start the all_gather of the shard (cast to the compute dtype: those bytes travel) into ``out``."""
        shard = unit.shard.detach().to(self._dtype(unit))
        work = dist.all_gather_into_tensor(out, shard, group=self.group, async_op=True)
        unit.pending = (work, shard)

    def _wait(self, unit):
        if unit.pending is not None:
            unit.pending[0].wait()
            unit.pending = None

    # ---- forward: the next unit's gather in flight while this one computes; free just after ------

    def _prefetch(self, unit):
        """Forward: a fresh buffer for the unit, its all_gather issued now."""
        unit.full = torch.empty(self.world * unit.shard_size, dtype=self._dtype(unit), device=unit.shard.device)
        self._issue_gather(unit, unit.full)

    def _gather(self, unit):
        """Just before the unit runs: its gathered vector (prefetched, or gathered now) becomes a leaf it views."""
        if unit.pending is None:
            self._prefetch(unit)
        self._wait(unit)
        full = unit.full
        full.requires_grad_(unit.shard.requires_grad)
        if full.requires_grad:
            full.register_post_accumulate_grad_hook(lambda t, unit=unit: self._after_backward(unit))
        self._bind(unit, full)

    def _before_forward(self, unit):
        self._gather(unit)
        if unit.next is not None:
            self._prefetch(unit.next)       # travels while this unit computes

    def _bind(self, unit, full):
        """Point the unit's parameter attributes at views of ``full``."""
        unit.full = full
        offset = 0
        for name, shape in zip(unit.names, unit.shapes):
            n = math.prod(shape)
            _set_tensor(unit.module, name, full[offset:offset + n].view(shape))
            offset += n

    def _free(self, unit):
        unit.full.untyped_storage().resize_(0)

    def _after_forward(self, unit, out):
        self._free(unit)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad, unit=unit: self._before_backward(unit))

    # ---- backward: gather again (the previous unit's in flight meanwhile), reduce-scatter after --

    def _refill(self, unit):
        """Backward: the same buffer's storage back, the all_gather into ``full.data`` issued now (autograd's
        saved views of ``full`` see the values again once it completes)."""
        full = unit.full
        full.untyped_storage().resize_(full.numel() * full.element_size())
        self._issue_gather(unit, full.data)

    def _before_backward(self, unit):
        if unit.pending is None:
            self._refill(unit)
        self._wait(unit)
        if unit.prev is not None:
            self._refill(unit.prev)         # the next unit of the backward travels while this one computes

    def _reduce_gradient(self, unit, full_grad):
        """This rank's slice of the unit's gradient, reduced in the shard's dtype, averaged over ranks."""
        grad = torch.empty_like(unit.shard)
        dist.reduce_scatter_tensor(grad, full_grad.to(unit.shard.dtype), group=self.group)
        return grad / self.world

    def _after_backward(self, unit):
        grad = self._reduce_gradient(unit, unit.full.grad)
        unit.shard.grad = grad if unit.shard.grad is None else unit.shard.grad + grad
        unit.full.grad = None
        self._free(unit)

    def forward(self, x):
        if self.compute_dtype is not None and torch.is_floating_point(x):
            x = x.to(self.compute_dtype)
        return self.module(x)

    # ---- checkpoints ----------------------------------------------------------------------------

    @torch.no_grad()
    def full_state_dict(self) -> dict:
        values = dict(self.module.state_dict())   # buffers, if any (the parameters are not registered any more)
        for unit in self._units:
            full = torch.empty(self.world * unit.shard_size, dtype=unit.shard.dtype, device=unit.shard.device)
            dist.all_gather_into_tensor(full, unit.shard.detach(), group=self.group)
            offset = 0
            for name, shape in zip(unit.names, unit.shapes):
                n = math.prod(shape)
                values[f"{unit.index}.{name}"] = full[offset:offset + n].view(shape).clone()
                offset += n
        return {key: values[key] for key in self._keys}
