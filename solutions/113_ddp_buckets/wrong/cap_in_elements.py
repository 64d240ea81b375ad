"""The bucket cap is compared with element counts, not bytes: buckets hold 4-8 times too much."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_buckets_follow_make_buckets"


class BucketedDDP(ref.BucketedDDP):
    def __init__(self, module, bucket_cap_bytes):
        super().__init__(module, bucket_cap_bytes)
        self.buckets = make_buckets([p.numel() for p in self.params], bucket_cap_bytes)
        self._bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}
        self._ready = [0] * len(self.buckets)
