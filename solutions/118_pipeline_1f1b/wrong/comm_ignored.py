"""simulate forgets t_comm: an op starts the moment the op it waits for on a neighbour ends."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_simulate_follows_the_dependencies"


def simulate(schedule, t_fwd, t_bwd, t_comm=0.0):
    return ref.simulate(schedule, t_fwd, t_bwd, 0.0)
