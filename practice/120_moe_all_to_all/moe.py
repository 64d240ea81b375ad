"""Problem 120: MoE expert parallelism with all-to-all.

Read README.md in this folder first.  Replace each ``raise NotImplementedError``
with your implementation, then run ``python judge.py 120``.

Part 1 is the forward pass, Part 2 the backward pass, Part 3 the capacity factor (token
dropping), Part 4 the load-balancing loss; each earns its own points.
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


def moe_forward(x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
    """A mixture-of-experts layer whose experts are spread over the ranks of ``group``.

    ``x``: [T_r, d], this rank's tokens (T_r may differ by rank, and may be 0).
    ``router_w``: [d, E], the same on every rank.  ``w1``: [E_local, d, h] and ``w2``:
    [E_local, h, d], this rank's experts.  E = N * E_local; global expert e lives on group
    rank e // E_local as local expert e % E_local; expert(x) = gelu(x @ w1) @ w2 (exact gelu).
    The inputs arrive on ``harness.device()``; make every tensor you create there too, the
    counts you exchange included (read them back with ``.tolist()``: split sizes are Python lists).

    Routing: logits = x @ router_w; each token takes its top_k experts by logit (ties as
    torch.topk breaks them; choice j is the j-th largest) with weights = softmax over those
    top_k logits.  Returns y: [T_r, d] with y[t] = sum_j weights[t, j] * expert_{e_j}(x[t]).

    Communication: exactly 3 ``dist.all_to_all_single`` per call: the token counts, the
    dispatch of the tokens (with split sizes), the combine of the results; nothing else.
    Differentiable for x, router_w, w1 and w2 (Part 2); router_w.grad holds this rank's
    tokens' contribution only (not all-reduced).

    Part 3, ``capacity_factor`` (None: nothing is dropped): each expert takes at most
    capacity = ceil(capacity_factor * T_r * top_k / E) of this rank's (token, choice) pairs.
    Pairs claim slots choice rank by choice rank (every token's first choice, then every
    token's second), by token index within one; a pair past its expert's capacity is dropped
    before the dispatch (not sent) and adds 0 to its token's output (the weights are not
    renormalised): a token with every choice dropped has y[t] = 0, and the residual around the
    layer carries it.  The counts, dispatch and combine carry the kept pairs only.

    Part 4, ``return_stats=True``: returns the tuple (y, aux_loss, dropped) instead of y.
    ``dropped``: a Python int, how many of this rank's (token, choice) pairs were dropped.
    ``aux_loss``: a 0-d tensor, Switch's load-balancing loss over the global batch (every rank
    of the group), the same value on every rank: E * sum_e f_e * P_e, with f_e the fraction of
    all (token, choice) pairs that chose expert e (dropped ones included) and P_e the mean over
    all tokens of softmax(x @ router_w)[e] (over all E experts); 0 when no rank has a token.
    Its gradient flows through P_e only, and on each rank it is that rank's own tokens' part
    (as for router_w.grad).  One more collective is allowed for it: at most one all_reduce of at
    most 2E + 1 numbers (or none, if the counts exchange carries the statistics); backward
    still issues only the 2 mirrored all_to_all.
    """
    raise NotImplementedError("moe_forward: see README.md, 'Part 1: forward'")
