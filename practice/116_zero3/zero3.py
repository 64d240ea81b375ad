"""Problem 116: ZeRO-3, fully sharded parameters.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 116``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn


class FullyShardedModel(nn.Module):
    """ZeRO-3 over an ``nn.Sequential``: each child (a *unit*) keeps only a flat 1/N shard of its parameters.

    ``FullyShardedModel(module, group=None, compute_dtype=None)``:
      * for each child with parameters: flatten its parameters (``child.named_parameters()`` order)
        into P_u elements, zero-pad to N*S_u with S_u = ceil(P_u / N), and keep elements
        [r*S_u, (r+1)*S_u) as one 1-D ``nn.Parameter``, in the module's own dtype (the master copy);
      * ``self.parameters()`` yields exactly these shards, one per child with parameters, in order;
      * the child's original parameter attributes (e.g. ``child.weight``) stay, but outside the
        child's own forward and backward they hold no full-size data (storage freed, size 0), except
        while the child is the next one of the pass and its all_gather is in flight (prefetch);
        and no other tensor keeps the gathered memory alive either (autograd's saved views
        included): free the storage with ``untyped_storage().resize_(0)``;
      * ``compute_dtype`` (e.g. ``torch.bfloat16``; None: the module's dtype): the units compute in it.
        Each shard is cast to it before its all_gather (those bytes travel), the units' attributes are
        views of the gathered vector in that dtype, ``forward`` casts a floating-point ``x`` to it, and
        the output comes back in it.  Each full gradient is cast back to the shard's dtype before its
        reduce_scatter, so the shards and their ``.grad`` stay in the master dtype (FSDP2's
        ``MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=float32)`` on a float32 model).
    """

    def __init__(self, module: nn.Sequential, group=None, compute_dtype=None):
        super().__init__()
        raise NotImplementedError("FullyShardedModel.__init__: see README.md, 'The contract'")

    def forward(self, x):
        """Run the units in order, each unit's all_gather issued one unit ahead (prefetch).

        Forward: just before a unit computes, its full parameters are there (prefetched, or gathered
        now for the first unit) and the next unit's all_gather is already issued (``async_op=True``),
        to travel while this unit computes; just after the unit runs, free its full parameters.  At
        most two units' full parameters are alive at once: the one computing and the next one.

        Backward, in reverse: before a unit's backward computes, gather its parameters again (or wait
        for the prefetched gather) and issue the all_gather of the unit before it; afterwards
        reduce_scatter its full gradient, averaged over ranks, and add it to the shard's ``.grad``
        (set it when there is none), then free the full parameters and gradient.
        """
        raise NotImplementedError("FullyShardedModel.forward: see README.md, 'The contract'")

    def full_state_dict(self) -> dict:
        """The unsharded state dict on every rank: ``module.state_dict()``'s keys, in order, with full tensors
        in the shards' (master) dtype."""
        raise NotImplementedError("FullyShardedModel.full_state_dict: see README.md, 'Checkpoints'")
