"""Problem 127: dynamic loss scaling across ranks.

Read README.md in this folder first.  Write ``DistributedLossScaler``: torch.amp.GradScaler's dynamic loss
scaling, with the skip decision shared by every rank of the group.  You will need ``torch.distributed``, and
``harness.device()`` for the tensor you create (``import harness``).  Run ``python judge.py 127``.
"""
from __future__ import annotations

import torch


class DistributedLossScaler:
    """Dynamic loss scaling for data-parallel training in float16 / bfloat16 autocast.

    ``DistributedLossScaler(init_scale, growth_factor, backoff_factor, growth_interval, group=None)``;
    ``group`` is the process group of the data-parallel ranks (None: the default group).  Each step::

        scaler.scale(loss).backward()      # k times, with gradient accumulation
        scaler.unscale_(optimizer)         # optional (e.g. before clipping); step() does it otherwise
        scaler.step(optimizer)             # optimizer.step(), unless some rank found inf/NaN
        scaler.update()                    # back off after a skipped step, grow after clean ones
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, group=None):
        """Store the settings; the scale starts at ``init_scale`` and the count of clean steps at 0."""
        raise NotImplementedError("DistributedLossScaler.__init__: see README.md, 'The contract'")

    def get_scale(self) -> float:
        """The current scale, as a Python float."""
        raise NotImplementedError("DistributedLossScaler.get_scale: see README.md, 'The contract'")

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the current scale (a new tensor, still in the autograd graph)."""
        raise NotImplementedError("DistributedLossScaler.scale: see README.md, 'The contract'")

    def unscale_(self, optimizer) -> None:
        """Divide every gradient of the optimizer's parameters by the scale, once per step; find inf/NaN.

        Whether any rank of the group found an inf, -inf or NaN is agreed by a collective on a flag.
        A second call before ``update()`` raises RuntimeError.
        """
        raise NotImplementedError("DistributedLossScaler.unscale_: see README.md, 'The contract'")

    def step(self, optimizer):
        """``unscale_(optimizer)`` unless already called this step; then ``optimizer.step()`` unless any rank
        found inf/NaN (then skip it).  Returns what ``optimizer.step()`` returned, or None when skipped."""
        raise NotImplementedError("DistributedLossScaler.step: see README.md, 'The contract'")

    def update(self) -> None:
        """After a skipped step: scale *= backoff_factor and the clean count restarts at 0.  After a clean step:
        the count grows by one; when it reaches growth_interval, scale *= growth_factor and it restarts at 0."""
        raise NotImplementedError("DistributedLossScaler.update: see README.md, 'The contract'")
