"""The planner returns the plan of least peak whatever the budget (recompute as much as possible): always
within the budget, but it recomputes more than the budget requires."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_recompute_flops_minimal"


def plan_checkpoints(unit_bytes, input_bytes, unit_flops, budget):
    low, high = 0, budget
    if not _fits(unit_bytes, input_bytes, unit_flops, budget):
        raise ValueError(f"nothing fits in {budget}")
    while low < high:                      # the least budget any plan fits, by bisection
        mid = (low + high) // 2
        low, high = (low, mid) if _fits(unit_bytes, input_bytes, unit_flops, mid) else (mid + 1, high)
    return ref.plan_checkpoints(unit_bytes, input_bytes, unit_flops, low)


def _fits(s, a, f, budget):
    try:
        ref.plan_checkpoints(s, a, f, budget)
        return True
    except ValueError:
        return False
