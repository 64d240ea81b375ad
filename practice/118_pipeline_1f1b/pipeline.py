"""Problem 118: the 1F1B pipeline schedule (1F1B 流水线调度).

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 118``.

An op is ("F", i) or ("B", i): the forward or backward of micro-batch i (from 0).
A schedule is one op list per stage: schedule[s] is what stage s runs, in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import harness  # noqa: F401  (harness.device(): where the tensors you make go)


def schedule_1f1b(num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    """The 1F1B schedule.  Stage s runs:

      * w = min(num_stages - s - 1, num_microbatches) warmup forwards F0 .. F(w-1);
      * then, for i = 0 .. m-w-1: ("F", w + i), ("B", i)   (one forward, one backward);
      * then the remaining backwards, B(m-w) .. B(m-1).

    >>> schedule_1f1b(2, 2)
    [[('F', 0), ('F', 1), ('B', 0), ('B', 1)], [('F', 0), ('B', 0), ('F', 1), ('B', 1)]]
    """
    raise NotImplementedError("schedule_1f1b: see README.md, 'schedule_1f1b and schedule_gpipe'")


def schedule_gpipe(num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    """GPipe: every stage runs all forwards in order, then all backwards in REVERSE micro-batch order."""
    raise NotImplementedError("schedule_gpipe: see README.md, 'schedule_1f1b and schedule_gpipe'")


@dataclass
class SimResult:
    """What ``simulate`` returns (given: you only fill it in)."""

    makespan: float                                       # when the last op ends (time starts at 0)
    bubble_ratio: float                                   # idle / (stages * makespan)
    events: list = field(default_factory=list)            # per stage: [(op, start, end), ...] in list order
    peak_activations: list = field(default_factory=list)  # per stage: most micro-batches forwarded, not yet backwarded


class ScheduleDeadlock(Exception):
    """Raised by ``simulate`` when no stage can run its next op.  Given: raise it, naming the stuck ops."""


def simulate(schedule, t_fwd: float, t_bwd: float, t_comm: float = 0.0) -> SimResult:
    """Run a schedule on an idealised pipeline and time every op.

    Each stage runs its ops in list order, one at a time.  F takes ``t_fwd``, B ``t_bwd``.
      * F(s, i) needs F(s-1, i) done, plus ``t_comm`` (stage 0 needs nothing);
      * B(s, i) needs F(s, i) done, and B(s+1, i) done plus ``t_comm`` (the last stage: only F(s, i)).
    An op starts as soon as its stage is free and its dependencies are met.
    Raises ScheduleDeadlock, naming each stuck op as "stage s: ('B', 0)", when the schedule cannot finish.
    """
    raise NotImplementedError("simulate: see README.md, 'simulate'")


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    """Run this rank's stage of a real pipeline (stage = rank in ``group``; None: all ranks).

      * ("F", i): stage 0 takes ``inputs[i]``, the others receive an ``act_shape`` activation
        from the previous stage; run ``stage_module``; the last stage computes
        ``loss_fn(out, targets[i]) / m`` (m = the number of F ops), the others send ``out``
        to the next stage.
      * ("B", i): the last stage backwards its loss; the others receive the gradient of
        ``out`` from the next stage and backward it; every stage but 0 sends its input's
        gradient to the previous stage.
    Received tensors have shape ``act_shape`` and the dtype of the stage's parameters; make the
    buffers you receive into on ``harness.device()`` (where the stage module and inputs arrive).
    Sends are non-blocking (dist.isend); wait for all of them before returning.
    Gradients accumulate into ``stage_module``'s .grad.  Returns the summed loss (a float)
    on the last stage, None elsewhere.
    """
    raise NotImplementedError("run_pipeline: see README.md, 'run_pipeline'")
