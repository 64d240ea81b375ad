"""Problem 115: ZeRO stage 1/2 sharded optimizer.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 115``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


class ShardedOptimizer:
    """A ZeRO optimizer: each rank keeps the optimizer state (stage 1) and the gradient (stage 2) of 1/N of the params.

    ``ShardedOptimizer(params, optimizer_cls, stage=2, group=None, master_dtype=None, **opt_kwargs)``:
      * ``params``: the model's parameters, equal on every rank, all of one dtype and one device;
        otherwise ``ValueError``.  ``stage`` is 1 or 2; otherwise ``ValueError``.
      * flat partition: the P elements of all params, in order, padded with zeros to N*S where
        S = ceil(P / N); rank r owns elements [r*S, (r+1)*S).
      * ``self.local_optimizer = optimizer_cls([<this rank's S elements>], **opt_kwargs)``: a torch
        optimizer over this rank's shard only, kept in ``master_dtype`` (default: the params' dtype).
        The shard owns its S elements (not a view into a full-size tensor): between steps a rank
        keeps only S-element tensors besides the model's params and grads.
      * every tensor you create goes on ``harness.device()``, the params' device (the rank's GPU
        under NCCL, the CPU under gloo): ``device=params[0].device``, ``zeros_like``, ``new_empty``.
    """

    def __init__(self, params, optimizer_cls, stage=2, group=None, master_dtype=None, **opt_kwargs):
        raise NotImplementedError("ShardedOptimizer.__init__: see README.md, 'The contract'")

    def zero_grad(self, set_to_none=True):
        """Clear every parameter's .grad (None, or zeros when set_to_none=False) and the shard's gradient."""
        raise NotImplementedError("ShardedOptimizer.zero_grad: see README.md, 'The contract'")

    def step(self):
        """One update, with the same result on every rank as ``optimizer_cls`` on the averaged full gradient.

        1. average the gradients over ranks: stage 1 all_reduce, stage 2 reduce_scatter (each rank
           receives only its S elements; afterwards every param's .grad is set to None);
           communicate in the parameters' dtype;
        2. ``local_optimizer.step()`` on this rank's shard (in ``master_dtype``);
        3. all_gather every rank's updated shard, cast to the parameters' dtype, into the params.
        """
        raise NotImplementedError("ShardedOptimizer.step: see README.md, 'The contract'")

    def state_dict(self):
        """Everything a fresh ShardedOptimizer on the same ranks needs to resume exactly (per rank is fine)."""
        raise NotImplementedError("ShardedOptimizer.state_dict: see README.md, 'Checkpoints'")

    def load_state_dict(self, sd):
        """Restore what ``state_dict()`` returned on this rank, into a freshly constructed ShardedOptimizer."""
        raise NotImplementedError("ShardedOptimizer.load_state_dict: see README.md, 'Checkpoints'")
