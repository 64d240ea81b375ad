"""peak_activations lets a micro-batch go at its B, as 1F1B does, although its W still needs the layer inputs."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_peak_activations"


def simulate(schedule, tf, tb, tw, t_comm=0.0):
    result = ref.simulate(schedule, tf, tb, tw, t_comm)
    peaks = []
    for ops in schedule:
        live = peak = 0
        for kind, _ in ops:
            live += (kind == "F") - (kind == "B")
            peak = max(peak, live)
        peaks.append(peak)
    result.peak_activations = peaks
    return result
