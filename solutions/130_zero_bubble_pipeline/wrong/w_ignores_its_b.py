"""simulate lets a W start without its B: a schedule that runs W before its B is timed instead of raising
ScheduleDeadlock.  (In list order after its B, as every feasible schedule has it, nothing changes.)"""
from contextlib import contextmanager

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_deadlocks_are_detected"


@contextmanager
def _w_needs_nothing():
    real = ref._dependencies
    ref._dependencies = lambda op, stage, p: [] if op[0] == "W" else real(op, stage, p)
    try:
        yield
    finally:
        ref._dependencies = real


def simulate(schedule, tf, tb, tw, t_comm=0.0):
    with _w_needs_nothing():
        return ref.simulate(schedule, tf, tb, tw, t_comm)
