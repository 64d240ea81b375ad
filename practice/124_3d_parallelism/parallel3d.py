"""Problem 124: 3D parallelism, DP x TP x PP.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 124``.

Megatron's rank order: tp varies fastest, then dp, then pp:
    global rank = pp_rank * dp * tp + dp_rank * tp + tp_rank
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

# You will want: torch.distributed as dist, torch.nn.functional as F, and harness (harness.device():
# where the tensors you make go, e.g. receive buffers).


class Groups(NamedTuple):
    """What ``make_groups`` returns (given: you only fill it in)."""

    dp_group: object    # this rank's data-parallel group (a process group from dist.new_group)
    tp_group: object    # its tensor-parallel group
    pp_group: object    # its pipeline group
    dp_rank: int        # which replica it belongs to
    tp_rank: int        # which tensor-parallel shard it holds
    pp_rank: int        # which pipeline stage it runs


def make_groups(world_size: int, dp: int, tp: int, pp: int) -> Groups:
    """This rank's data-, tensor- and pipeline-parallel groups, and its coordinates, in Megatron's order.

    * ``dp * tp * pp != world_size``: raise ValueError naming dp*tp*pp and world_size, before
      creating any group.
    * The tp group of a rank: the ranks with its (dp_rank, pp_rank), tp_rank = 0 .. tp-1;
      the dp group: same (tp_rank, pp_rank); the pp group: same (dp_rank, tp_rank).
    * ``dist.new_group`` must be called by EVERY rank for EVERY group (also those it is not
      in), in the same order on every rank.  A group of one rank is still a ``new_group``.

    Example: make_groups(8, dp=2, tp=2, pp=2) on rank 5 returns the groups of ranks [5, 7] (dp),
    [4, 5] (tp) and [1, 5] (pp), with dp_rank=0, tp_rank=1, pp_rank=1.
    """
    raise NotImplementedError("make_groups: see README.md, 'make_groups'")


class Parallel3D(nn.Module):
    """A stack of L MLP blocks, x -> fc2(gelu(fc1(x))), trained with data x tensor x pipeline parallelism.

    ``blocks``: the model, a list of L entries: the (fc1, fc2) pair of nn.Linear (fc1: d -> h, fc2: h -> d)
    for each block of this rank's stage, None for every other block (a rank is given its own stage's
    blocks only).  ``groups``: a ``Groups``.  ``microbatches``: m.  ``lr``: plain SGD's step.

    * Stage s = groups.pp_rank keeps blocks [s*L/pp, (s+1)*L/pp) (contiguous, equal counts).
    * Each block is Megatron's MLP over groups.tp_group: this rank keeps rows [t*h/tp, (t+1)*h/tp) of
      fc1's weight and bias, the same columns of fc2's weight, and fc2's whole bias (added once, after
      the all_reduce).  ``self.parameters()`` are exactly these shards (copies of them), nothing else.
    * ValueError when pp does not divide L or tp does not divide h.
    """

    def __init__(self, blocks, groups: Groups, microbatches: int, lr: float):
        super().__init__()
        raise NotImplementedError("Parallel3D.__init__: see README.md, 'Parallel3D'")

    def train_step(self, x: torch.Tensor, y: torch.Tensor):
        """One SGD step on this replica's rows x, y ([B/dp, d] each; dp*m divides B): x holds its values
        on stage 0 only, y on the last stage only, and both are NaN of the same shape elsewhere.

        Split them into m micro-batches (tensor_split(m)) and run them through the pipeline (1F1B or
        GPipe; sends non-blocking).
        Each micro-batch's loss is F.mse_loss(out, y_mb) / m.  Then every gradient is averaged over
        groups.dp_group (all_reduce, then / dp) and p -= lr * grad.

        Returns this replica's loss (a float: the sum of the micro-batches' loss / m, before the
        update) on the last stage, None on every other stage.
        """
        raise NotImplementedError("Parallel3D.train_step: see README.md, 'train_step'")
