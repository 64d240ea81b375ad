"""``Perturb(rank, n)``: on rank ``rank``, the n-th point-to-point send of the call (from 0, in issue
order, whatever the group) carries a changed copy of its tensor (+1 on every element; ``not`` for
bool); the sender's own tensor is untouched, and the op's record says ``perturbed``.

The change is made inside the rank, below the code under test (in the harness's kernel for the send),
but which send it is travels with the call: code in the rank could read it.  A property built on it
shows that a result depends on its messages; that no data moved another way is the traffic witness's.
"""
from __future__ import annotations

from .base import Probe, RankPart


class _PerturbSend(RankPart):
    name = "perturb"

    def __init__(self, rank: int, nth: int):
        self.rank, self.nth = rank, nth

    def enter(self, recorder):
        if recorder.rank == self.rank:
            recorder.perturb_send(self.nth)


class Perturb(Probe):
    name = "perturb"

    def __init__(self, rank: int, nth: int):
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (rank, nth)):
            raise ValueError(f"Perturb(rank, nth_send) takes two integers >= 0; got {rank!r}, {nth!r}")
        self.rank, self.nth = rank, nth

    def rank_part(self, world):
        return _PerturbSend(self.rank, self.nth)
