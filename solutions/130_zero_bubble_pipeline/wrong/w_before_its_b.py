"""Each deferred W is put in front of the B it follows, so stage 0 runs W0 before B0 (and stage s W(k - s)
before B(k)): a weight gradient before the output gradient it needs exists."""
from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_every_op_once_w_after_its_b"


def schedule_zb_h1(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    schedule = []
    for s in range(p):
        w = min(p - s - 1, m)
        ops = [("F", i) for i in range(w)]
        for k in range(m):
            if w + k < m:
                ops.append(("F", w + k))
            if k >= s:
                ops.append(("W", k - s))
            ops.append(("B", k))
        schedule.append(ops + [("W", i) for i in range(max(m - s, 0), m)])
    return schedule
