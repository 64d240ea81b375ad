"""peak_activations counts every forward a stage runs, not the ones still waiting for their backward."""
from harness import reference_of

ref = reference_of(__file__)
schedule_1f1b, schedule_gpipe, SimResult, ScheduleDeadlock = (ref.schedule_1f1b, ref.schedule_gpipe, ref.SimResult,
                                                              ref.ScheduleDeadlock)
run_pipeline = ref.run_pipeline
REJECTED_BY = "test_peak_activations"


def simulate(schedule, t_fwd, t_bwd, t_comm=0.0):
    result = ref.simulate(schedule, t_fwd, t_bwd, t_comm)
    result.peak_activations = [sum(1 for op in ops if op[0] == "F") for ops in schedule]
    return result
