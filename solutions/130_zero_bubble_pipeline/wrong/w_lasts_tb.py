"""simulate times a W with tb, as if the weight half of the backward cost what the input half does."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_simulate_follows_the_dependencies"


def simulate(schedule, tf, tb, tw, t_comm=0.0):
    return ref.simulate(schedule, tf, tb, tb, t_comm)
