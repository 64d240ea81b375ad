"""The s weight gradients a stage deferred run at the end newest first, W(m - 1) .. W(m - s), not oldest first
as torch's ZB1P schedule runs them."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_agrees_with_torch_pipelining"


def schedule_zb_h1(num_stages, num_microbatches):
    schedule = []
    for s, ops in enumerate(ref.schedule_zb_h1(num_stages, num_microbatches)):
        tail = min(s, num_microbatches)
        schedule.append(ops[:len(ops) - tail] + ops[len(ops) - tail:][::-1])
    return schedule
