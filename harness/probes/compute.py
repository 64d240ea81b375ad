"""``Compute``: the compute ops each rank ran between issuing a communication op and waiting on it.

Fills ``CommOp.compute_between`` (``record.ops.COMPUTE_OPS``: the matmul family, fused attention,
softmax, exp).  It puts every aten op through a Python dispatch mode, so it slows the call; give it to
a whole block (``harness.defaults(probes=[Compute()])``) so no call of the block looks different.
"""
from __future__ import annotations

from .base import Probe, RankPart


class _CountCompute(RankPart):
    name = "compute"

    def enter(self, recorder):
        self.recorder = recorder
        recorder.count_compute()

    def exit(self):
        self.recorder.finish()   # leaves the counting mode (modes entered after it first)


class Compute(Probe):
    name = "compute"

    def rank_part(self, world):
        return _CountCompute()

    def finish(self, world, call):
        return None   # the counts are in the trace (CommOp.compute_between)
