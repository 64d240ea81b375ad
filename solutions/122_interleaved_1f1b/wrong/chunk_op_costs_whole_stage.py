"""simulate charges a chunk's F tf and its B tb, the whole stage's cost, instead of tf/v and tb/v."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_makespan_and_bubble"


def simulate(schedule, p, v, tf, tb):
    return ref._timeline(schedule, lambda r, op: ref._needs(r, op, p, v), tf, tb)
