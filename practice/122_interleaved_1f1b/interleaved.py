"""Problem 122: the interleaved 1F1B pipeline schedule.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 122``.

p ranks each hold v model chunks: chunk c of rank r is virtual stage r + c*p of p*v.
An op is ("F" | "B", micro-batch, chunk): the forward or backward of one micro-batch
on one of this rank's chunks.  A schedule is one op list per rank, in order.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import harness  # noqa: F401  (harness.device(): where the tensors you make go)


class ScheduleDeadlock(Exception):
    """Raised by ``simulate`` when no rank can run its next op.  Given: raise it, naming a stuck op."""


def interleaved_schedule(p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    """Megatron-LM's interleaved 1F1B schedule: per rank, its ops in order.

    Forwards run micro-batches in groups of p, each group through chunk 0, 1, ..., v - 1;
    backwards likewise, chunk v - 1 first.  Rank r runs w warm-up forwards,
        w = min(2*(p - r - 1) + (v - 1)*p, m*v)     (v = 1: min(p - r - 1, m), 118's 1F1B),
    then one forward one backward while forwards remain, then the remaining backwards.
    Raises ValueError when m is not a multiple of p.

    >>> interleaved_schedule(1, 1, 2)
    [[('F', 0, 0), ('F', 0, 1), ('B', 0, 1), ('B', 0, 0)]]
    """
    raise NotImplementedError("interleaved_schedule: see README.md, 'interleaved_schedule'")


def simulate(schedule, p: int, v: int, tf: float, tb: float):
    """Time a schedule: returns (makespan, busy), busy[r] = [(op, start, end), ...] in rank r's list order.

    Each rank runs its ops in list order, one at a time; a chunk's F lasts tf / v, its B tb / v.
    With s = r + c*p the virtual stage of op (kind, i, c) on rank r:
      * F needs the F of micro-batch i on stage s - 1 ended (stage 0: nothing);
      * B needs its own F ended, and the B of micro-batch i on stage s + 1 (the last stage: only its F).
    Stage s lives on rank s % p as its chunk s // p.  An op starts as soon as its rank is free and
    what it needs has ended; time starts at 0.  Raises ScheduleDeadlock naming a stuck op as
    "rank r: ('B', 0, 1)" when the schedule can never finish.
    """
    raise NotImplementedError("simulate: see README.md, 'simulate'")


def run_interleaved(chunks, schedule, microbatches, act_shape, loss_fn, group=None):
    """Run this rank's ops of a real interleaved pipeline (r = rank in ``group``; None: all ranks).

      * chunks[c] is virtual stage s = r + c*p; ops = schedule[r]; m = (F ops in it) / v.
      * ("F", i, c): stage 0 takes microbatches[i][0]; any other stage receives an ``act_shape`` input
        from rank (r - 1) % p; runs chunks[c]; the last stage (p*v - 1) computes
        loss_fn(out, microbatches[i][1]) / m, any other stage sends its output to rank (r + 1) % p.
      * ("B", i, c): the last stage backwards its loss; the others receive the gradient of their output
        from rank (r + 1) % p and backward it; every stage but 0 sends its input's gradient to rank
        (r - 1) % p.
      * p = 1: the neighbour is this rank itself: hand tensors over locally, no communication.
    Receive buffers: ``act_shape``, the chunks' dtype, on harness.device().  Sends are non-blocking
    (dist.isend), all waited for before returning; receives may block.  Gradients accumulate into the
    chunks' .grad.  Returns the summed loss (a float) on rank p - 1, None on the others.
    """
    raise NotImplementedError("run_interleaved: see README.md, 'run_interleaved'")
