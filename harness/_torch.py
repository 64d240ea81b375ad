"""Every private piece of torch the engine touches, in one place: a torch upgrade means auditing this file.

The tracer needs what torch does not publish: the c10d C++ classes (Work, ProcessGroup, the backends,
Future), the process-group registry, the dispatcher's guards and the function-mode stack, the functional
collectives' module, each group's sequence counter, and the tensor and storage accessors that memory
measurements bind before learner code runs.  Each is named here once, with what it is for; the rest
of the engine imports these names, never ``torch._C`` or a private torch module itself.
(Measured against torch 2.12-2.14: see the README's "Supported torch versions".)
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional_collectives  # noqa: F401  (its wait_tensor)
from torch.overrides import _get_current_function_mode_stack as function_mode_stack  # noqa: F401

pop_function_mode = torch._C._pop_torch_function_stack   # the innermost TorchFunctionMode, whatever it is

C10D = torch._C._distributed_c10d            # Work, ProcessGroup, the backend classes, _resolve_process_group
Work, ProcessGroup, Future = C10D.Work, C10D.ProcessGroup, torch._C.Future
c10d = dist.distributed_c10d                 # the Python layer: _register_process_group, destroy_process_group
autograd_c = torch._C._autograd              # the saved-tensor hooks' push and pop

# dispatcher guards: run an op below the autograd keys, or below ADInplaceOrView
BelowAutograd = torch._C._AutoDispatchBelowAutograd
BelowADInplaceOrView = torch._C._AutoDispatchBelowADInplaceOrView
FAKE_MODE_KEY = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)

# tensor and storage accessors, bound before learner code can patch the Python classes
tensor_storage = torch._C.TensorBase.untyped_storage
tensor_grad = torch._C.TensorBase.grad.__get__
tensor_detach = torch._C.TensorBase.detach
storage_nbytes = torch._C.StorageBase.nbytes
storage_data_ptr = torch._C.StorageBase.data_ptr
storage_device = torch._C.StorageBase.device.__get__
DisableTorchFunctionSubclass = torch._C.DisableTorchFunctionSubclass

BACKEND_CLASS_NAMES = ("Backend", "ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupMPI", "ProcessGroupUCC")


def fake_mode_active() -> bool:
    """torch.compile's fake-tensor tracing is on (its ops run no communication)."""
    return FAKE_MODE_KEY is not None and torch._C._get_dispatch_mode(FAKE_MODE_KEY) is not None


def process_groups() -> list:
    """Every process group torch has registered (the default group and every new_group)."""
    return list(c10d._world.pg_map)


def resolve_process_group(name):
    return C10D._resolve_process_group(name)


def sequence_number(pg) -> int:
    """The group's C++ op counter: how many ops its backend has run."""
    return pg._get_sequence_number_for_group()


def backend_classes() -> list:
    """The c10d backend classes this torch has."""
    return [getattr(C10D, n) for n in BACKEND_CLASS_NAMES if hasattr(C10D, n)]
