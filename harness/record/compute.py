"""What a rank computed while its messages were in flight, and whether its result needed that work.

``ComputeWatch`` (entered for a call by ``probes.Compute``) sees every torch call of the rank's Python code
through a ``TorchFunctionMode``.  Each compute call -- matmuls, einsum, linear layers, fused attention,
softmax, exp -- is numbered; the recorder notes the number when an op is issued and when its wait starts,
so ``CommOp.compute_between`` is how many compute calls ran while the op was in flight.

That alone counts a dummy ``torch.exp`` placed between posting and waiting.  So the watch also follows
where each compute call's result goes: every storage a torch call writes (its output, or the tensor it
changes in place, views included) carries the numbers of the compute calls its inputs came from.  When
the rank function returns, the numbers its returned tensors carry are the work the result needed, and
``CommOp.compute_used`` counts those among the in-flight calls.  Work on data no output depends on, a
dummy op, a sleep: none of these count.  (A custom autograd Function's Python code is watched too; work
done in C++ alone, such as autograd's own backward formulas, is not.)
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from .. import _torch

# torch functions and Tensor methods that do the work of a layer or of attention
COMPUTE_FUNCTIONS = frozenset((
    "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm", "addmm", "addbmm", "mv", "addmv", "dot",
    "vdot", "einsum", "tensordot", "linear", "bilinear", "scaled_dot_product_attention", "softmax",
    "log_softmax", "_softmax", "exp", "exp_", "conv1d", "conv2d", "conv3d"))
_WRITES_ITS_FIRST = frozenset(("__setitem__", "index_put_", "masked_scatter_"))   # in place, ending without "_"


def _tensors(value, into: list) -> list:
    if isinstance(value, torch.Tensor):
        into.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensors(item, into)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, into)
    return into


def _key(tensor):
    try:
        storage = _torch.tensor_storage(tensor)
        return _torch.storage_device(storage).type, _torch.storage_data_ptr(storage)
    except Exception:   # noqa: BLE001 -- a tensor with no plain storage carries nothing
        return None


class ComputeWatch(TorchFunctionMode):
    """Numbers this thread's compute calls, and follows which storages each one's result reached."""

    def __init__(self):
        super().__init__()
        self.count = 0                  # compute calls so far in the call
        self.sources: dict = {}         # storage key -> the numbers of the compute calls it came from

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        inputs = _tensors((args, kwargs), [])
        came_from = frozenset().union(*(self.sources.get(_key(t), ()) for t in inputs))
        if name in COMPUTE_FUNCTIONS:
            self.count += 1
            came_from = came_from | {self.count}
        written = _tensors(out, [])
        if args and isinstance(args[0], torch.Tensor) and (name.endswith("_") or name in _WRITES_ITS_FIRST):
            written.append(args[0])
        for t in written:
            key = _key(t)
            if key is not None:
                if came_from:
                    self.sources[key] = came_from
                else:
                    self.sources.pop(key, None)   # a fresh result (or one overwritten) owes nothing to compute
        return out

    def needed_by(self, result) -> frozenset:
        """The numbers of the compute calls that the tensors in ``result`` came from."""
        return frozenset().union(*(self.sources.get(_key(t), ()) for t in _tensors(result, [])))
