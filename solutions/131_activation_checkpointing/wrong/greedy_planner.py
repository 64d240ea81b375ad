"""A greedy planner: start from keeping everything and recompute, one at a time, the unit that frees the most
bytes per FLOP, each recomputed unit its own segment, until the peak fits.  It fits, but not at the least
recompute: merging segments, or recomputing one big unit instead of two small ones, can be cheaper."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_plan_is_optimal"


def _peak(flags, s, a):
    held, peak = 0, 0
    for u, recompute in enumerate(flags):
        if recompute:
            peak = max(peak, held + s[u])
            held += a[u]
        else:
            held += s[u]
    return max(peak, held)


def plan_checkpoints(unit_bytes, input_bytes, unit_flops, budget):
    n = len(unit_bytes)
    flags = [False] * n
    while _peak(flags, unit_bytes, input_bytes) > budget:
        todo = [u for u in range(n) if not flags[u]]
        if not todo:
            raise ValueError(f"nothing fits in {budget}")
        u = max(todo, key=lambda u: (unit_bytes[u] - input_bytes[u]) / (unit_flops[u] + 1))
        flags[u] = True
    return [(u, u + 1, flags[u]) for u in range(n)]
