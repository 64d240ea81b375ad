"""schedule_zb_h1 splits the backward but runs every W right after its B: 1F1B's bubble minus nothing.  The
gradient no longer waits for W on its way back, but the W's fill none of the ramps."""
from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_makespan_and_bubble"


def schedule_zb_h1(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    schedule = []
    for s in range(p):
        w = min(p - s - 1, m)
        ops = [("F", i) for i in range(w)]
        for k in range(m):
            ops += [("F", w + k)] * (w + k < m) + [("B", k), ("W", k)]
        schedule.append(ops)
    return schedule
