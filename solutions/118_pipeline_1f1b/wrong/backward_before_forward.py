"""The steady state runs one backward then one forward, so the last stage starts with B0 before F0."""
from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_schedules_hold_every_op_once_and_are_feasible"


def schedule_1f1b(num_stages, num_microbatches):
    schedule = []
    for s in range(num_stages):
        warmup = min(num_stages - s - 1, num_microbatches)
        ops = [("F", i) for i in range(warmup)]
        for i in range(num_microbatches - warmup):
            ops += [("B", i), ("F", warmup + i)]
        ops += [("B", i) for i in range(num_microbatches - warmup, num_microbatches)]
        schedule.append(ops)
    return schedule
