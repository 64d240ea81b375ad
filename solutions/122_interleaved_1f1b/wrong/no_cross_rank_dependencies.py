"""simulate waits only on the op's own rank (a B for its own F), never for the neighbouring virtual stages."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_simulate_follows_the_dependencies"


def simulate(schedule, p, v, tf, tb):
    return ref._timeline(schedule, lambda r, op: [(r, ("F", op[1], op[2]))] if op[0] == "B" else [], tf / v, tb / v)
