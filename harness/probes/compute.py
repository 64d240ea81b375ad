"""``Compute``: the compute each rank ran between issuing a communication op and waiting on it.

Fills ``CommOp.compute_between`` (compute calls in flight: the matmul family, fused attention, softmax,
exp) and ``CommOp.compute_used`` (those a backward pass later went through: work the result needed; see
``record.compute``).  It puts every torch call of the rank through a Python function mode, so it slows
the call a little; give it to a whole block (``harness.defaults(probes=[Compute()])``, or problems.yaml's
``probes:``) so no call of the block looks different to the ranks.
"""
from __future__ import annotations

from .base import Probe, RankPart


class _CountCompute(RankPart):
    name = "compute"

    def enter(self, recorder):
        recorder.count_compute()   # (the recorder leaves the mode when the call ends: ``Recorder.finish``)


class Compute(Probe):
    name = "compute"

    def rank_part(self, world):
        return _CountCompute()

    def finish(self, world, call):
        return None   # the counts are in the trace (CommOp.compute_between)
