"""All-reduces the float32 bucket itself: the average is exact but nothing is compressed."""
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_bf16_bytes_are_half_of_fp32"


def bf16_compress_hook(state, bucket):
    buffer = bucket.buffer()
    buffer.div_(dist.get_world_size(state.process_group))
    return ref._all_reduce_future(buffer, state.process_group).then(lambda fut: fut.value()[0])
