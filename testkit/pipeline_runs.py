"""A pipeline trained on real ranks, checked from the test process (problems 118, 122 and 130).

Each stage (in 122 each virtual stage) is a tiny Linear-Tanh-Linear ``random_mlp``; a case's ``widths`` are
``[d_in, d, h, d_out]``.

    stage_widths(widths, s, last)                  stage s's widths: d_in -> h -> d on stage 0, ..., d -> h -> d_out
    listed(tensor)                                 a tensor as nested lists (None stays None), to hand to a rank
    run_pipelines(fn, target, case, inputs, world, pp)   ``fn`` on the ranks: one pipeline, or pipelines in groups
    full_batch_step(stages, grads_before, xs, ys)  the truth: the stages in sequence on the whole batch, one backward
    against_the_truth(values, where, truth)        each rank's returned value beside its pipeline's truth
    check_loss(got, loss, last, ...)               a rank returned the full-batch loss, or None where it should
    check_message(op, act, what, rank, stalled)    a traced point-to-point op carries act_shape, and no send blocks
"""
from __future__ import annotations

import math

import torch
from torch import nn

import harness
from testkit.groups import positions
from testkit.models import mse


def stage_widths(widths, s: int, last: int) -> list:
    """``last``: the index of the last stage (its output is d_out)."""
    d_in, d, h, d_out = widths
    return [d_in if s == 0 else d, h, d_out if s == last else d]


def listed(tensor):
    """Plain data pickles the same every time, so ``harness.run(reuse=True)`` knows a repeated call."""
    return None if tensor is None else tensor.tolist()


def run_pipelines(fn, target, case, inputs, world=None, pp=None):
    """``harness.run(fn, world, target, inputs(case, where), act_shape, pp, reuse=True)``: one pipeline of
    case["p"] ranks, or with ``pp``, ``world`` ranks as pipelines of pp consecutive ranks; ``where``: global rank
    -> (pipeline, stage); act_shape: (case["rows"], d)."""
    world = world or case["p"]
    act_shape = (case["rows"], case["widths"][1])
    return harness.run(fn, world, target, inputs(case, positions(world, pp or world)), act_shape, pp, reuse=True)


def full_batch_step(stages, grads_before, xs, ys):
    """Single-process training on the whole batch: each parameter's .grad first set to its entry of
    ``grads_before(stage)``, the stages in sequence on all micro-batches' rows at once, the mean loss, one
    backward.  (loss, per stage its parameters' gradients)."""
    for stage in stages:
        for q, g in zip(stage.parameters(), grads_before(stage)):
            q.grad = g
    loss = mse(nn.Sequential(*stages)(torch.cat(xs)), torch.cat(ys))
    loss.backward()
    return loss.item(), [[q.grad for q in stage.parameters()] for stage in stages]


def against_the_truth(values, where, truth):
    """(global rank g, what it returned, its stage in its pipeline, ``truth(pipeline)``), for each rank:
    ``where[g]`` is (pipeline, stage); ``truth`` (``full_batch_step``'s (loss, grads)) runs once a pipeline."""
    truths = {}
    for g, out in enumerate(values):
        pipeline, s = where[g]
        if pipeline not in truths:
            truths[pipeline] = truth(pipeline)
        yield g, out, s, truths[pipeline]


def check_loss(got, loss, last: bool, what: str, rank: int, who: str, the_last: str, rel_tol=1e-9, abs_tol=1e-12):
    """``got``: what rank ``rank`` returned; the ``last`` stage returns the full-batch ``loss``, the others None.
    ``what``: the run, in words; ``who``: this stage (or rank) in words; ``the_last``: the last one in words."""
    want = loss if last else None
    right = got is None if want is None else (isinstance(got, (int, float)) and
                                              math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol))
    harness.check(right, f"{what}: {who} returned {got!r}, expected {want!r}: {the_last} returns the full-batch loss "
                         "(the sum over micro-batches of loss_fn(out, target) / m), the others None", rank=rank)


def check_message(op, act, what: str, rank: int, stalled: str) -> None:
    """``op``: a send or receive of the run's trace; ``act``: act_shape; ``what``: the run, in words;
    ``stalled``: what deadlocks when sends block ("1F1B", "the pipeline")."""
    harness.check([tuple(x) for x in op.shapes] == [act],
                  f"{what}: {op.describe()} carries shape {op.shapes}; activations and their "
                  f"gradients are act_shape = {list(act)}", rank=rank)
    harness.check(not (op.kind == "send" and op.blocking),
                  f"{what}: {op.describe()} blocked until the peer received it (dist.send); "
                  f"post sends with dist.isend and wait for them later, or {stalled} deadlocks", rank=rank)
