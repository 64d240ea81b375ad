"""Measures exposed time from the last bucket's own ready time, not from the last gradient overall."""
from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_exposed_comm"


def exposed_comm(ready, buckets, sizes, bw, latency=0.0):
    spans = comm_timeline(ready, buckets, sizes, bw, latency)
    return max(0.0, spans[-1][1] - max(ready[i] for i in buckets[-1])) if spans else 0.0
