"""The planner checks only what the forward leaves held, held(L) <= budget, and forgets that recomputing a
segment [i, j) in backward holds held(i) + s[i] + ... + s[j-1] at once: one long recomputed segment "fits"."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_plan_is_optimal"


def plan_checkpoints(unit_bytes, input_bytes, unit_flops, budget):
    n = len(unit_bytes)
    best = [dict() for _ in range(n + 1)]
    best[0][0] = (0, [])
    for i in range(n):
        for held, (flops, plan) in list(best[i].items()):
            ref._offer(best[i + 1], held + unit_bytes[i], flops, plan + [(i, i + 1, False)])
            for j in range(i + 1, n + 1):
                ref._offer(best[j], held + input_bytes[i], flops + sum(unit_flops[i:j]), plan + [(i, j, True)])
    fits = [(flops, plan) for held, (flops, plan) in best[n].items() if held <= budget]
    if not fits:
        raise ValueError(f"nothing fits in {budget}")
    return min(fits)[1]
