"""W assigns each parameter's .grad instead of adding to it: only the last micro-batch's gradient is left (and
whatever .grad held before the step is lost)."""
from contextlib import contextmanager

import torch

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_run_matches_single_process"


def _overwriting(kept):
    for layer, _, out, grad in kept:
        params = list(layer.parameters())
        if params:
            for q, g in zip(params, torch.autograd.grad(out, params, grad)):
                q.grad = g


@contextmanager
def _patched():
    real, ref._weight_gradients = ref._weight_gradients, _overwriting
    try:
        yield
    finally:
        ref._weight_gradients = real


def run_zero_bubble(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    with _patched():
        return ref.run_zero_bubble(stage_module, ops, act_shape, inputs, targets, loss_fn, group)
