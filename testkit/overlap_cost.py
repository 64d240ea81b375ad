"""The cost figures of a point-to-point ring, and of its overlap, read from the harness's trace.

    ring_figures(trace, ranks, phase)   -> {"bytes_per_rank", "busiest_link", "messages_per_rank"}
    hidden_fraction(trace, ranks, phase) -> the smallest, over the ranks, fraction of receives hidden

Ring attention (119, 123) and collective matmul (129) pass chunks between neighbours with send/recv; their
catalogue's ``cost`` names these figures.  Each is the largest over the ranks: a ring is as slow as its busiest
rank.  The numbers are what the harness saw issued, never what the code under test reports.
"""
from __future__ import annotations


def ring_figures(trace, ranks, phase: str) -> dict:
    """``bytes_per_rank``: the most bytes one rank sent; ``busiest_link``: the most bytes one rank sent to one
    peer; ``messages_per_rank``: the most sends one rank issued (all in ``phase``)."""
    per_rank, per_link, messages = {}, {}, {}
    for rank in ranks:
        for op in trace.ops(rank, "send", phase=phase):
            per_rank[rank] = per_rank.get(rank, 0) + op.in_bytes
            per_link[(rank, op.peer)] = per_link.get((rank, op.peer), 0) + op.in_bytes
            messages[rank] = messages.get(rank, 0) + 1
    return {"bytes_per_rank": max(per_rank.values(), default=0),
            "busiest_link": max(per_link.values(), default=0),
            "messages_per_rank": max(messages.values(), default=0)}


def hidden_fraction(trace, ranks, phase: str) -> float:
    """Of each rank's receives in ``phase``, the fraction hidden behind compute: those with compute the returned
    values depend on run between posting and waiting (``op.compute_used > 0``; a dummy op, a sleep or a wait
    right after the post counts nothing).  The smallest over the ranks; 1.0 when no rank received anything."""
    fractions = []
    for rank in ranks:
        receives = trace.ops(rank, "recv", phase=phase)
        if receives:
            fractions.append(sum((op.compute_used or 0) > 0 for op in receives) / len(receives))
    return min(fractions, default=1.0)
