"""Never broadcasts rank 0's parameters, so ranks that start apart stay apart."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_ddp_matches_single_process_training"


class BucketedDDP(ref.BucketedDDP):
    def __init__(self, module, bucket_cap_bytes):
        real_broadcast = dist.broadcast
        dist.broadcast = lambda *args, **kwargs: None
        try:
            super().__init__(module, bucket_cap_bytes)
        finally:
            dist.broadcast = real_broadcast
