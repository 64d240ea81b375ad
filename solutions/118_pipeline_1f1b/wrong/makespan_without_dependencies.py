"""simulate runs each stage's ops back to back from time 0, ignoring what they wait for."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_makespan_and_bubble_formula"


def simulate(schedule, t_fwd, t_bwd, t_comm=0.0):
    result = ref.simulate(schedule, t_fwd, t_bwd, t_comm)  # still raises ScheduleDeadlock
    events = []
    for ops in schedule:
        clock, stage = 0.0, []
        for op in ops:
            length = t_fwd if op[0] == "F" else t_bwd
            stage.append((tuple(op), clock, clock + length))
            clock += length
        events.append(stage)
    makespan = max((e for stage in events for _, _, e in stage), default=0.0)
    busy = sum(e - b for stage in events for _, b, e in stage)
    bubble = 1 - busy / (len(schedule) * makespan) if makespan else 0.0
    return SimResult(makespan, bubble, events, result.peak_activations)
