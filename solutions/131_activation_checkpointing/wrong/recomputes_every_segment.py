"""train_step wraps every segment in the recompute, kept ones too ("checkpoint each segment"): values right,
memory no higher than the plan's, but the kept units' forwards run twice."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_recompute_flops_minimal"


def train_step(units, plan, x, y, loss_fn, group=None):
    h = x
    for start, stop, _ in plan:
        segment = units[start:stop]
        params = [p for unit in segment for p in unit.parameters()]
        h = ref._Recompute.apply(ref._chain(segment), h, *params)
    loss = loss_fn(h, y)
    loss.backward()
    ref._average_gradients(units, group)
    return loss.item()
