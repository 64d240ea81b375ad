"""Sums the bf16 gradients over the ranks but never divides by the world size."""
import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_bf16_average_within_rounding_bound"


def bf16_compress_hook(state, bucket):
    buffer = bucket.buffer()
    return ref._all_reduce_future(buffer.to(torch.bfloat16), state.process_group).then(
        lambda fut: buffer.copy_(fut.value()[0]))
