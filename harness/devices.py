"""Where rank code keeps its tensors: ``device()``, inputs moved there on arrival, and the device audit.

Under NCCL each rank owns one GPU (``cuda:<rank>``); under gloo it computes on the CPU.  Rank code
that makes its tensors on ``harness.device()`` runs on either.  The test process always sends and
receives CPU tensors: the harness moves a call's tensor arguments to the rank's device on arrival,
and ``wire`` brings returned tensors back as CPU copies.

The device audit (``harness.defaults(audit_devices=True)``) proves rank code device-correct on a
machine without a GPU: while the rank function runs, a tensor made without naming a device lands on
``meta`` (no data), as it would land on the CPU under NCCL instead of on the rank's GPU.  Code that
names ``harness.device()`` (or makes tensors like others, ``zeros_like``, ``new_empty``) runs and
returns as usual; code that does not fails with torch's own "expected device" error, or returns a
meta tensor, which the harness refuses in plain words.
"""
from __future__ import annotations

import contextlib

AUDIT_DEVICE = "meta"


def device():
    """This rank's device: its own GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gpu_count() -> int:
    """GPUs this process can use (0 without CUDA)."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def on_rank_device(value, where):
    """``value`` with every tensor and module in it moved to ``where`` (lists, tuples and dicts followed)."""
    import torch
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return value if _is_on(value, where) else value.to(where)
    if type(value) in (list, tuple):
        return type(value)(on_rank_device(v, where) for v in value)
    if isinstance(value, dict):
        return {k: on_rank_device(v, where) for k, v in value.items()}
    return value


def _is_on(value, where) -> bool:
    import torch
    if isinstance(value, torch.Tensor):
        return value.device == where
    return all(t.device == where for t in list(value.parameters()) + list(value.buffers()))


def made_without_a_device_land_on(name: str | None):
    """The context a rank function runs in: ``torch.device(name)`` as the default device, or nothing."""
    if name is None:
        return contextlib.nullcontext()
    import torch
    return torch.device(name)
