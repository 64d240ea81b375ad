"""Problem 120: MoE expert parallelism with all-to-all.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 120``.

Part 1 is the forward pass, Part 2 the backward pass; each earns its own points.
``_AllToAll`` below is a suggested shape, not a requirement: only ``moe_forward`` is tested.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import harness  # noqa: F401  (harness.device(): where the tensors you make go)


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` along dim 0 that autograd can differentiate through.

    ``_AllToAll.apply(x, out_splits, in_splits, group)``: row block i of ``x`` (``in_splits[i]``
    rows) goes to group rank i; the result stacks the blocks received from ranks 0, 1, ...
    (``out_splits[i]`` rows from rank i).
    """

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        """Send the row blocks; remember the splits for backward (Part 1)."""
        raise NotImplementedError("_AllToAll.forward: see README.md, 'Part 1: forward'")

    @staticmethod
    def backward(ctx, grad):
        """Send each gradient row back to the rank its row came from, then None for the rest (Part 2)."""
        raise NotImplementedError("_AllToAll.backward: see README.md, 'Part 2: backward'")


def moe_forward(x, router_w, w1, w2, top_k, group=None):
    """A mixture-of-experts layer whose experts are spread over the ranks of ``group``.

    ``x``: [T_r, d], this rank's tokens (T_r may differ by rank, and may be 0).
    ``router_w``: [d, E], the same on every rank.  ``w1``: [E_local, d, h] and ``w2``:
    [E_local, h, d], this rank's experts.  E = N * E_local; global expert e lives on group
    rank e // E_local as local expert e % E_local; expert(x) = gelu(x @ w1) @ w2 (exact gelu).
    The inputs arrive on ``harness.device()``; make every tensor you create there too, the
    counts you exchange included (read them back with ``.tolist()``: split sizes are Python lists).

    Routing: logits = x @ router_w; each token takes its top_k experts by logit (ties as
    torch.topk breaks them) with weights = softmax over those top_k logits.
    Returns y: [T_r, d] with y[t] = sum_j weights[t, j] * expert_{e_j}(x[t]).

    Communication: exactly 3 ``dist.all_to_all_single`` per call: the token counts, the
    dispatch of the tokens (with split sizes), the combine of the results; nothing else.
    Differentiable for x, router_w, w1 and w2 (Part 2); router_w.grad holds this rank's
    tokens' contribution only (not all-reduced).
    """
    raise NotImplementedError("moe_forward: see README.md, 'Part 1: forward'")
