"""The check that learner code left the tracer as the harness installed it.

``integrity_snapshot`` runs in each rank after ``_kernels.install`` and before any learner code:
it remembers every piece the record depends on -- the tracer modules' globals, the recorder's and
policy's methods, the torch functions ``install`` patched, the backend methods it refused, what the
op-count check and ``harness.memory`` measure with, and the public names of the package front --
and returns a ``verify`` that the rank loop calls after each call.  Replacing a method, a module
attribute or a function's code object raises ``TraceTampered`` then.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from .. import _torch
from .groups import GroupCounters
from .kernels import backend_classes
from .compute import ComputeWatch
from .ops import BACKEND_METHODS
from .phases import phase
from .recorder import Recorder, active
from ..errors import TraceTampered
from ..memory import Held, SavedForBackward, Storages, live_storages, live_tensor_bytes, saved_for_backward
from .policy import Policy

_FRONT_MODULE = __package__.rpartition(".")[0]   # harness
# the tracer's own modules: every global in them is fixed once ``install`` has run
_TRACER_MODULES = ("ops", "groups", "recorder", "kernels", "integrity", "policy", "compute", "phases")
# what the package front hands out for these names (it resolves them lazily; pinned here at once)
_FRONT = {"phase": phase, "live_tensor_bytes": live_tensor_bytes, "live_storages": live_storages,
          "saved_for_backward": saved_for_backward}


def _memory_pieces() -> list:
    """What ``harness.memory`` measures with: a learner who swaps any of it could hide state."""
    memory = sys.modules[Storages.__module__]
    pieces = [(memory, n) for n, v in vars(memory).items()
              if callable(v) and getattr(v, "__module__", None) == memory.__name__ and not isinstance(v, type)]
    pieces += [(memory, n) for n in ("_get_objects", "_collect", "_freeze_count", "_unfreeze", "_weak_ref", "_sleep",
                                     "_Tensor", "_UntypedStorage", "_tensor_storage", "_tensor_grad", "_tensor_detach",
                                     "_storage_nbytes", "_storage_data_ptr", "_storage_device", "_no_torch_function",
                                     "saved_tensors_hooks", "compress", "_SETTLE", "_active_recorder")
               if hasattr(memory, n)]
    pieces += [(cls, n) for cls in (Storages, SavedForBackward, Held) for n in vars(cls) if not n.startswith("__")]
    hooks = torch.autograd.graph.saved_tensors_hooks
    pieces += [(hooks, "__enter__"), (hooks, "__exit__"),
               (_torch.autograd_c, "_push_saved_tensors_default_hooks"),
               (_torch.autograd_c, "_pop_saved_tensors_default_hooks")]
    return pieces


def _front_pieces() -> list:
    """The package front's public names for the tracer and memory functions, resolved now.

    Read from ``sys.modules`` (the front is loaded: this module is inside it), written as its own lazy
    ``__getattr__`` would on first use, so a later replacement of ``harness.phase`` shows.
    """
    front = vars(sys.modules[_FRONT_MODULE])
    for name, value in _FRONT.items():
        front.setdefault(name, value)
    return [(sys.modules[_FRONT_MODULE], name) for name in _FRONT]


def integrity_snapshot():
    """Remember every piece of the tracer; the returned check raises TraceTampered if any was replaced.

    The rank loop takes it before learner code runs and keeps it in a local
    variable, so replacing a method, a module attribute or a function's code
    object is caught after the call.
    """
    c10d, work, group = _torch.c10d, _torch.Work, _torch.ProcessGroup
    # Recorder's own methods and its group half's, looked up on Recorder: one replaced there shadows the original
    names = {Recorder: set(vars(Recorder)) | set(vars(GroupCounters))}
    pieces = [(cls, n) for cls in (Recorder, GroupCounters, Policy, ComputeWatch) for n in names.get(cls, vars(cls))
              if callable(getattr(cls, n)) and not n.startswith("__")]
    pieces += [(ComputeWatch, "__torch_function__")]
    pieces += [(work, "wait"), (work, "get_future"), (_torch.Future, "wait"),
               (group, "monitored_barrier"), (group, "__init__"),
               (c10d, "_register_process_group"), (c10d, "destroy_process_group"), (dist, "destroy_process_group"),
               (_torch.functional_collectives, "wait_tensor"), (_torch, "sequence_number"),
               (_torch, "process_groups")]
    modules = [sys.modules[f"{__package__}.{name}"] for name in _TRACER_MODULES] + [_torch]
    pieces += [(module, n) for module in modules for n in vars(module) if not n.startswith("__")]
    pieces += [(cls, n) for cls in backend_classes() for n in BACKEND_METHODS if n in vars(cls)]
    # what the op-count check reads: a Python stand-in for the C++ counter could say anything
    pieces += [(cls, n) for cls in (group, *backend_classes())
               for n in ("_get_sequence_number_for_group", "name") if n in vars(cls)]
    pieces += _memory_pieces() + _front_pieces()
    snapshot = [(owner, name, getattr(owner, name), getattr(getattr(owner, name), "__code__", None))
                for owner, name in pieces]
    recorder = active()
    recorder_fields, recorder_module = set(vars(recorder)), sys.modules[Recorder.__module__]

    def verify():
        for owner, name, value, code in snapshot:
            now = getattr(owner, name, None)
            if now is not value or getattr(now, "__code__", None) is not code:
                raise TraceTampered(f"the harness's tracer was modified ({getattr(owner, '__name__', owner)}.{name})")
        if recorder_module.active() is not recorder:
            raise TraceTampered("the harness's tracer was modified (the recorder)")
        if set(vars(recorder)) - recorder_fields:
            raise TraceTampered("the harness's tracer was modified (the recorder's methods were shadowed)")
    return verify
