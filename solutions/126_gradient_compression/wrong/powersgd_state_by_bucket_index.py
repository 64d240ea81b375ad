"""Keys error buffers and Q by bucket.index() and position: DDP rebuilds its buckets after step 0, so they mix up."""
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_powersgd_is_a_rank_r_projection_with_error_feedback"


class _Slot:
    def __init__(self, key):
        self.key = key

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return self.key == other.key


def powersgd_hook(state, bucket):
    class Bucket:   # the same bucket, its parameters replaced by (bucket index, position) keys
        def __init__(self):
            self.buffer, self.gradients = bucket.buffer, bucket.gradients

        def parameters(self):
            return [_Slot((bucket.index(), i)) for i in range(len(bucket.gradients()))]
    return ref.powersgd_hook(state, Bucket())
