"""Decides on the local inf/NaN check alone: no all_reduce of the flag, so only the rank that overflowed skips."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_overflow_on_one_rank_skips_everywhere"


class DistributedLossScaler(ref.DistributedLossScaler):
    def _agree(self, flag):
        return bool(flag.item())
