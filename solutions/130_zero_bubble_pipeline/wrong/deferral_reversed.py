"""Stage s defers its W by p - 1 - s instead of s: the first stage, which waits longest for its first gradient,
holds back the most weight gradients, the last stage none."""
from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_canonical_order"


def schedule_zb_h1(num_stages, num_microbatches):
    p, m = num_stages, num_microbatches
    schedule = []
    for s in range(p):
        w, late = min(p - s - 1, m), p - 1 - s
        ops = [("F", i) for i in range(w)]
        for k in range(m):
            if w + k < m:
                ops.append(("F", w + k))
            ops.append(("B", k))
            if k >= late:
                ops.append(("W", k - late))
        schedule.append(ops + [("W", i) for i in range(max(m - late, 0), m)])
    return schedule
