"""Starts each bucket when its gradients are ready, as if every bucket had its own stream."""
from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_timeline"


def comm_timeline(ready, buckets, sizes, bw, latency=0.0):
    spans = []
    for bucket in buckets:
        start = max(ready[i] for i in bucket)
        spans.append((start, start + latency + sum(sizes[i] for i in bucket) / bw))
    return spans


def exposed_comm(ready, buckets, sizes, bw, latency=0.0):
    spans = comm_timeline(ready, buckets, sizes, bw, latency)
    return max(0.0, spans[-1][1] - max(ready)) if spans else 0.0
