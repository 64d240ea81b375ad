"""run_zero_bubble makes its receive buffers float64 whatever the stage's dtype: a float32 stage then gets a
float64 input its Linear refuses, or a message half the size its buffer expects."""
from contextlib import contextmanager

import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_run_matches_single_process"


class _Float64Buffers:
    """torch inside run_zero_bubble, with torch.empty always float64."""
    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*shape, dtype=None, device=None):
        return torch.empty(*shape, dtype=torch.float64, device=device)


@contextmanager
def _patched():
    ref.torch = _Float64Buffers()
    try:
        yield
    finally:
        ref.torch = torch


def run_zero_bubble(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    with _patched():
        return ref.run_zero_bubble(stage_module, ops, act_shape, inputs, targets, loss_fn, group)
