"""peak_activations counts every forward a stage runs, not the ones still waiting for their backward."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_peak_activations"


def simulate(schedule, t_fwd, t_bwd, t_comm=0.0):
    result = ref.simulate(schedule, t_fwd, t_bwd, t_comm)
    result.peak_activations = [sum(1 for op in ops if op[0] == "F") for ops in schedule]
    return result
