"""Fills buckets walking from the FIRST parameter, the order of forward, not of backward."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_bucket_contract"


def make_buckets(sizes, cap):
    buckets, current, used = [], [], 0
    for i in range(len(sizes)):
        if current and used + sizes[i] > cap:
            buckets.append(current)
            current, used = [], 0
        current.append(i)
        used += sizes[i]
    return buckets + [current] if current else buckets


class BucketedDDP(ref.BucketedDDP):
    pass
