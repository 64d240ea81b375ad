"""Problem 131: memory-optimal activation checkpointing, under data parallelism.

Read README.md in this folder first.  Replace each ``raise NotImplementedError`` with your implementation,
then run ``python judge.py 131``.

A chain of L units (each a module, x -> unit(x)) is cut by a **plan** into segments ``(start, stop, recompute)``:
units start .. stop-1, in order, covering 0 .. L-1.  A kept segment runs with autograd as usual.  A recomputed
segment runs without autograd, keeps only its input for backward, and in backward runs its forward again --
drawing the same random numbers (dropout) as the first time -- before its backward.

You write the recompute yourself: ``torch.utils.checkpoint`` is torch's own implementation of it, and the file
under test may not use it.  ``torch.get_rng_state`` / ``torch.set_rng_state`` and ``torch.random.fork_rng`` are
yours to use.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def sqrt_segments(num_units: int) -> list[tuple[int, int, bool]]:
    """The sqrt(L) scheme: segments of k = ceil(sqrt(L)) units from unit 0 (the last one what is left), every
    one recomputed.

    >>> sqrt_segments(5)
    [(0, 3, True), (3, 5, True)]
    """
    raise NotImplementedError("sqrt_segments: see README.md, 'The contract'")


def plan_checkpoints(unit_bytes: list[int], input_bytes: list[int], unit_flops: list[int],
                     budget: int) -> list[tuple[int, int, bool]]:
    """The plan with the least recompute FLOPs whose peak of saved bytes is at most ``budget``.

    ``unit_bytes[u]`` (s): the bytes unit u saves for backward when it runs with autograd, its input included;
    ``input_bytes[u]`` (a): the bytes of its input (a[0] = 0: the batch is the caller's); ``unit_flops[u]`` (f):
    its forward FLOPs.  The peak is the largest of held(L) and, for each recomputed segment [i, j),
    held(i) + s[i] + ... + s[j-1], where held(i) is what the segments before unit i keep: s[u] for each kept
    unit, a[start] for each recomputed segment.  Raises ValueError when no plan fits.
    """
    raise NotImplementedError("plan_checkpoints: see README.md, 'The contract'")


def train_step(units: list[torch.nn.Module], plan: list[tuple[int, int, bool]], x: torch.Tensor, y: torch.Tensor,
               loss_fn, group: dist.ProcessGroup | None = None) -> float:
    """One data-parallel training step of the chain ``units`` on this rank's batch ``x`` (targets ``y``).

    Runs the units by ``plan``, takes ``loss = loss_fn(out, y)``, runs backward (recomputing each recomputed
    segment from its input, with the RNG state its forward had, and leaving the RNG as the forward left it),
    then replaces every parameter's ``.grad`` by its mean over the ranks of ``group`` (None: every rank), with
    ``all_reduce``.  The parameters have no ``.grad`` when it is called.  Returns this rank's loss as a float.
    """
    raise NotImplementedError("train_step: see README.md, 'The contract'")
