"""``Flops``: each rank's floating-point operations (torch's ``FlopCounterMode``: matmuls, convolutions,
attention), counted by the harness around the rank function, never reported by the code under test.
``RunResult.probes["flops"]`` (also ``RunResult.flops``): one count per rank."""
from __future__ import annotations

from .base import Probe, RankPart


class _CountFlops(RankPart):
    name = "flops"

    def enter(self, recorder):
        from torch.utils.flop_counter import FlopCounterMode
        self.counter = FlopCounterMode(display=False)
        self.counter.__enter__()

    def exit(self):
        self.counter.__exit__(None, None, None)
        return int(self.counter.get_total_flops())


class Flops(Probe):
    name = "flops"

    def rank_part(self, world):
        return _CountFlops()

    def finish(self, world, call):
        counts = [call.rank_results.get(self.name, {}).get(r) for r in range(world.world_size)]
        return None if None in counts else counts
