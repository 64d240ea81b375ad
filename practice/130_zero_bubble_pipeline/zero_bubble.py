"""Problem 130: the zero-bubble pipeline schedule, ZB-H1.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 130``.

An op is ("F", i), ("B", i) or ("W", i): the forward of micro-batch i (from 0), its backward for the
input gradient only (B), and its backward for the weight gradients (W).  A schedule is one op list per
stage: schedule[s] is what stage s runs, in order.

run_zero_bubble will need ``torch.distributed`` (``import torch.distributed as dist``) and
``harness.device()`` for the tensors you create (``import harness``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


def schedule_zb_h1(num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    """The ZB-H1 schedule.  With p = num_stages and m = num_microbatches, stage s runs:

      * w = min(p - s - 1, m) warm-up forwards F0 .. F(w-1)   (1F1B's warm-up);
      * then for k = 0 .. m-1: ("F", w + k) if w + k < m, then ("B", k), then ("W", k - s) if k >= s;
      * then the s deferred weight gradients, W(max(m - s, 0)) .. W(m-1).

    >>> schedule_zb_h1(2, 2)
    [[('F', 0), ('F', 1), ('B', 0), ('W', 0), ('B', 1), ('W', 1)], [('F', 0), ('B', 0), ('F', 1), ('B', 1), ('W', 0), ('W', 1)]]
    """
    raise NotImplementedError("schedule_zb_h1: see README.md, 'schedule_zb_h1'")


@dataclass
class SimResult:
    """What ``simulate`` returns (given: you only fill it in)."""

    makespan: float                                       # when the last op ends (time starts at 0)
    bubble_ratio: float                                   # idle / (stages * makespan)
    events: list = field(default_factory=list)            # per stage: [(op, start, end), ...] in list order
    peak_activations: list = field(default_factory=list)  # per stage: most micro-batches between their F and W


class ScheduleDeadlock(Exception):
    """Raised by ``simulate`` when no stage can run its next op.  Given: raise it, naming the stuck ops."""


def simulate(schedule, tf: float, tb: float, tw: float, t_comm: float = 0.0) -> SimResult:
    """Run a schedule on an idealised pipeline and time every op.

    Each stage runs its ops in list order, one at a time.  F lasts ``tf``, B ``tb``, W ``tw``.
      * F(s, i) needs F(s-1, i) done, plus ``t_comm`` (stage 0 needs nothing);
      * B(s, i) needs F(s, i) done, and B(s+1, i) done plus ``t_comm`` (the last stage: only F(s, i));
      * W(s, i) needs B(s, i) done.
    An op starts as soon as its stage is free and its dependencies are met.  peak_activations counts
    +1 at each F and -1 at each W.  Raises ScheduleDeadlock, naming each stuck op as "stage s: ('W', 0)",
    when the schedule cannot finish.
    """
    raise NotImplementedError("simulate: see README.md, 'simulate'")


def run_zero_bubble(stage_module: torch.nn.Sequential, ops, act_shape, inputs=None, targets=None, loss_fn=None,
                    group=None):
    """Run this rank's stage of a real pipeline (stage = rank in ``group``; None: all ranks).

      * ("F", i): stage 0 takes ``inputs[i]``, the others receive an ``act_shape`` activation from the
        previous stage; run ``stage_module`` (an nn.Sequential); the last stage computes
        ``loss_fn(out, targets[i]) / m`` (m = the number of F ops), the others send ``out`` to the next stage.
      * ("B", i): the last stage starts from its loss, the others receive the gradient of ``out`` from the
        next stage; compute the gradient of the stage's input and of every layer's input, but no parameter's
        gradient; every stage but 0 sends its input's gradient to the previous stage.
      * ("W", i): compute micro-batch i's parameter gradients from what B kept and add them into .grad;
        no communication; then keep nothing of micro-batch i.
    Use autograd for every gradient, each computed once.  Received tensors have shape ``act_shape`` and the
    dtype of the stage's parameters; make them on ``harness.device()``.  Sends are non-blocking
    (dist.isend); wait for all of them before returning.  Returns the summed loss (a float) on the last
    stage, None elsewhere.
    """
    raise NotImplementedError("run_zero_bubble: see README.md, 'run_zero_bubble'")
