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

    ``FullyShardedModel(module, group=None)``:
      * for each child with parameters: flatten its parameters (``child.named_parameters()`` order)
        into P_u elements, zero-pad to N*S_u with S_u = ceil(P_u / N), and keep elements
        [r*S_u, (r+1)*S_u) as one 1-D ``nn.Parameter``;
      * ``self.parameters()`` yields exactly these shards, one per child with parameters, in order;
      * the child's original parameter attributes (e.g. ``child.weight``) stay, but outside the
        child's own forward and backward they hold no full-size data (storage freed, size 0);
        and no other tensor keeps the gathered memory alive either (autograd's saved views
        included): free the storage with ``untyped_storage().resize_(0)``.
    """

    def __init__(self, module: nn.Sequential, group=None):
        super().__init__()
        raise NotImplementedError("FullyShardedModel.__init__: see README.md, 'The contract'")

    def forward(self, x):
        """Run the units in order.  Just before a unit runs, all_gather its full parameters; just after, free them.

        In backward, gather them again before the unit's backward; afterwards reduce_scatter its
        full gradient, averaged over ranks, and add it to the shard's ``.grad`` (set it when
        there is none), then free the full parameters and gradient.
        """
        raise NotImplementedError("FullyShardedModel.forward: see README.md, 'The contract'")

    def full_state_dict(self) -> dict:
        """The unsharded state dict on every rank: ``module.state_dict()``'s keys, in order, with full tensors."""
        raise NotImplementedError("FullyShardedModel.full_state_dict: see README.md, 'Checkpoints'")
