"""Prefetches two units ahead, to hide more latency: while a unit computes, three units' full parameters
are alive (its own and the next two), one more than the statement allows."""
from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_at_most_two_units_gathered_at_once"


class FullyShardedModel(ref.FullyShardedModel):
    def _before_forward(self, unit):
        self._gather(unit)
        ahead = unit.next
        for _ in range(2):
            if ahead is not None and ahead.pending is None:
                self._prefetch(ahead)
            ahead = ahead.next if ahead is not None else None

    def _before_backward(self, unit):
        if unit.pending is None:
            self._refill(unit)
        self._wait(unit)
        ahead = unit.prev
        for _ in range(2):
            if ahead is not None and ahead.pending is None:
                self._refill(ahead)
            ahead = ahead.prev if ahead is not None else None
