"""run_zero_bubble sends float32 activations and gradients as float64, for accuracy on the way: right values to
float32's tolerance and the right shapes, but twice the bytes of the stage's dtype."""
from contextlib import contextmanager

import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_run_follows_the_op_list"


class _WideMessages:
    """torch.distributed inside run_zero_bubble, with every float32 message widened to float64 on the wire."""
    def __init__(self):
        self.in_flight = []                       # the widened copies, referenced until their sends are waited on

    def __getattr__(self, name):
        return getattr(dist, name)

    def isend(self, tensor, dst, group=None):
        wide = tensor.double() if tensor.dtype == torch.float32 else tensor
        self.in_flight.append(wide)
        return dist.isend(wide, dst, group=group)

    def recv(self, buffer, src, group=None):
        if buffer.dtype != torch.float32:
            return dist.recv(buffer, src, group=group)
        wide = torch.empty(buffer.shape, dtype=torch.float64, device=buffer.device)
        sender = dist.recv(wide, src, group=group)
        buffer.copy_(wide)
        return sender


@contextmanager
def _patched():
    ref.dist = _WideMessages()
    try:
        yield
    finally:
        ref.dist = dist


def run_zero_bubble(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    with _patched():
        return ref.run_zero_bubble(stage_module, ops, act_shape, inputs, targets, loss_fn, group)
