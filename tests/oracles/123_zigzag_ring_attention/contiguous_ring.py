"""Problem 119's layout under a causal mask, forward only: trusted test code, the baseline zigzag must beat.

Rank r of N holds the contiguous positions r*L .. (r+1)*L - 1 (L = S/N).  K/V shards travel downstream
round the ring, and a block (this rank's queries, one rank's keys) is computed whole, under the causal
mask, unless every pair in it is masked.  Rank r computes r + 1 blocks of L x L: the last rank does
N times the first rank's work, which is what the balance test's bound rules out.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def contiguous_causal_attention(q, k, v):
    """This rank's rows of causal attention over [B, H, L, D] shards, on every rank of the default group."""
    rank, world, length = dist.get_rank(), dist.get_world_size(), q.shape[2]
    span = torch.arange(length, device=q.device)
    out = torch.zeros_like(q)
    top = q.new_full(q.shape[:-1] + (1,), -math.inf)      # running row max
    total = torch.zeros_like(top)                          # running row sum of exp(logit - top)
    for hop in range(world):
        owner = (rank - hop) % world
        works = []
        if hop < world - 1:
            k_in, v_in = torch.empty_like(k), torch.empty_like(v)
            works = [dist.isend(k, (rank + 1) % world), dist.isend(v, (rank + 1) % world),
                     dist.irecv(k_in, (rank - 1) % world), dist.irecv(v_in, (rank - 1) % world)]
        visible = (rank * length + span)[:, None] >= (owner * length + span)[None, :]
        if visible.any():
            logits = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~visible, -math.inf)
            new_top = torch.maximum(top, logits.amax(-1, keepdim=True))
            weights, shrink = torch.exp(logits - new_top), torch.exp(top - new_top)
            out, total, top = out * shrink + weights @ v, total * shrink + weights.sum(-1, keepdim=True), new_top
        for work in works:
            work.wait()
        if works:
            k, v = k_in, v_in
    return out / total
