"""simulate sweeps the ranks until nothing more can start and returns what ran: a deadlock gives a makespan, no ScheduleDeadlock."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_deadlocks_are_detected"


def simulate(schedule, p, v, tf, tb):
    rows, end, free = [[tuple(op) for op in ops] for ops in schedule], {}, [0.0] * len(schedule)
    busy, heads, moved = [[] for _ in rows], [0] * len(rows), True
    while moved:
        moved = False
        for r, ops in enumerate(rows):
            if heads[r] < len(ops) and all(n in end for n in ref._needs(r, ops[heads[r]], p, v)):
                op = ops[heads[r]]
                start = max([free[r]] + [end[n] for n in ref._needs(r, op, p, v)])
                end[(r, op)] = free[r] = start + (tf if op[0] == "F" else tb) / v
                busy[r].append((op, start, free[r]))
                heads[r], moved = heads[r] + 1, True
    return max(free, default=0.0), busy
