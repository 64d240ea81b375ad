"""The probe seam: what a probe may add to a call, on the rank's side and on the test process's."""
from __future__ import annotations

from dataclasses import dataclass


class RankPart:
    """What a probe runs inside each rank, around the rank function.  Travels pickled with the call."""

    name = ""

    def enter(self, recorder):
        """Just before the rank function runs (the call's recorder is ready)."""

    def exit(self):
        """Just after it (also when it raised): this rank's result, as plain data (or None)."""
        return None


@dataclass
class CallOutcome:
    """What the test process knows once a call is over: each rank's value, the trace, and each rank's
    rank-part results by probe name (None for a rank that did not reply)."""
    values: list
    trace: object
    rank_results: dict


class Probe:
    """A measurement or a fault of one call.  Subclasses override what they need; ``name`` keys the result."""

    name = ""

    def world_key(self):
        """A hashable the world must be built for (its pool key includes it), or None."""
        return None

    def rank_part(self, world) -> RankPart | None:
        """What travels to the ranks for this call (it may depend on the world: what it can witness)."""
        return None

    def start(self, world):
        """The test process's side, just before the call is sent to the ranks."""

    def tick(self, world):
        """Every watchdog tick while the call runs (about every 50 ms)."""

    def finish(self, world, call: CallOutcome):
        """After the call: the probe's result (plain data).  May raise a HarnessError about the call."""
        return call.rank_results.get(self.name)
