"""Problem 125: ZeRO-1 data-parallel training that checkpoints, and resumes on another world size.

Read README.md in this folder for the whole contract, then replace each ``raise NotImplementedError`` and run
``python judge.py 125``.  Every tensor you create for the parameters goes on their device (``harness.device()``);
the data, the masks and the generators stay on the CPU.  You will want ``hashlib``, ``json``, ``math``, ``os``
and ``torch.distributed as dist`` besides ``torch``.
"""
from __future__ import annotations

import torch


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted: no complete one in the folder, or one of its files missing or not
    byte-for-byte what was saved.  The message names the file (or the folder)."""


class Trainer:
    """Data-parallel training with a ZeRO-1 sharded optimizer over the default process group.

    Attributes the tests read:
        step             the number of training steps taken since the very first one (restored by resume)
        local_optimizer  a torch.optim.Optimizer over this rank's shard only: one tensor of S = ceil(P / N)
                         elements, slice [r*S, (r+1)*S) of the flattened parameters padded with zeros to N*S
    """

    def __init__(self, model: torch.nn.Module, dataset, global_batch: int, optimizer_cls, seed: int,
                 dropout: float = 0.0, **opt_kwargs):
        """``model``: a torch.nn.Module with the same parameters on every rank (float64 in the tests).
        ``dataset``: ``len(dataset)``, ``dataset.in_features``, ``dataset[i] -> (x_i, y_i)`` (1-D CPU tensors).
        ``global_batch``: B, the samples of one step over all ranks.  ``optimizer_cls(**opt_kwargs)``: SGD with
        momentum, Adam or AdamW, built over this rank's shard.  ``seed``: the data order of epoch e is
        randperm(len(dataset), Generator().manual_seed(seed + e)); the dropout generator is
        Generator().manual_seed(seed), one stream drawn identically on every rank.  ``dropout``: p in [0, 1)."""
        raise NotImplementedError

    def train_step(self) -> None:
        """One step: fetch this rank's share [r::N] of the step's global batch with dataset[i] (once each, nothing
        else), draw the whole batch's dropout mask, loss = sum of squared errors / b, sum the gradients over
        ranks, update this rank's shard with local_optimizer, all-gather the updated parameters, step += 1."""
        raise NotImplementedError

    def save(self, directory: str, step: int) -> None:
        """Collective.  Save the checkpoint of step ``step`` (the caller passes ``self.step``) into
        ``directory/step_<step>/``: the protocol is that every rank writes its own part (a temporary name, then
        a rename; who writes which file is yours), then, after a barrier, one rank writes the commit marker
        ``COMMIT`` last and atomically, naming every file with its sha256.  Returns on every rank once COMMIT is
        in place."""
        raise NotImplementedError

    def resume(self, directory: str) -> int:
        """Collective, on a freshly built Trainer, on any world size.  Load the newest complete checkpoint (the
        largest k whose step_<k>/COMMIT exists) into the model, the local optimizer (re-sharded for this world),
        the dropout generator and the data position; returns its step.  Raises CheckpointError when there is
        no complete checkpoint, or when a file of the newest one is missing or not as saved (naming it)."""
        raise NotImplementedError
