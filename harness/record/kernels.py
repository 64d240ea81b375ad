"""Where the rank's recorder hears of each op: dispatcher kernels, and the patched Python paths.

Why the dispatcher: every public path to a collective -- ``dist.all_reduce``,
``from torch.distributed import all_reduce``, ``distributed_c10d.*``,
``ProcessGroup.allreduce`` and the C++ reducer inside DistributedDataParallel --
ends in a ``c10d::*`` dispatcher op.  A Python kernel registered for those ops
on the autograd keys sees each one, and ordinary tensor ops pay nothing (a
``TorchDispatchMode`` would see them too, but slows every aten op ~2.5x).

Functional collectives (``torch.distributed._functional_collectives``: the
``_c10d_functional::*`` ops, their ``_c10d_functional_autograd`` twins and
``_dtensor::shard_dim_alltoall``) run their c10d op below autograd, out of that
kernel's sight.  They get kernels of their own one key lower, on
``ADInplaceOrView``: there they are traced and policed like any other op, and the
autograd formulas torch registers for them (on the Autograd key) still run.
Their waits (``wait_tensor``, also on an AsyncCollectiveTensor's first use) are
timed like ``Work.wait`` and waits on ``Work.get_future()``.  torch.compile's
fake-tensor tracing runs through these kernels too, and records nothing.

The paths that skip those kernels are closed another way:
  * calling a ``Backend`` object's methods directly is refused (patched here);
  * anything else (inference-mode tensors, a learner who re-registers a kernel)
    is caught because gloo's own per-group sequence counters (C++, out of
    Python's reach) then disagree with the trace (``_groups``).  Every group is
    checked: the ones alive at the end of the call, and each one the call
    destroys, at the moment it is destroyed (its counter goes with it).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from .. import _torch
from .groups import ranks_of
from .ops import BACKEND_METHODS, FUNCTIONAL_KINDS, KINDS, tensors_in
from .recorder import Recorder, activate, active
from ..errors import ForbiddenOp

_LIBRARIES: list = []   # keeps the kernel registrations alive


def install(rank: int, flight_fd: int | None, shared_dir: str | None = None) -> Recorder:
    """Make this rank's recorder and patch every path to it.  Called once per rank."""
    recorder = activate(rank, flight_fd, shared_dir)
    _register_kernels()
    _torch.Work.wait = _timed(_torch.Work.wait)
    # code that waits on a Work's future (comm hooks, all_reduce_coalesced(async_op=True)) waits on its op too
    original_get_future = _torch.Work.get_future

    def get_future(self, *args, **kwargs):
        future = original_get_future(self, *args, **kwargs)
        if active() is not None:
            active().alias(self, future)
        return future

    _torch.Work.get_future, _torch.Future.wait = get_future, _timed(_torch.Future.wait)
    for cls in backend_classes():
        for name in BACKEND_METHODS:
            if hasattr(cls, name):
                setattr(cls, name, _refuse_backend_call(name))
    if getattr(torch.ops.c10d, "monitored_barrier_", None) is None:
        _record_monitored_barrier_in_python()   # a torch whose ProcessGroup calls its backend directly
    _time_functional_waits()
    _follow_group_lifetimes()
    return recorder


def _sends_nothing(args) -> bool:
    """Fake or meta tensors (torch.compile tracing a graph, shape checks) run no communication."""
    if _torch.fake_mode_active():
        return True
    return any(t.is_meta for t in tensors_in(list(args)))


def _kernel(op, issue: str, bind: str, below):
    """In front of one op: the recorder's ``issue`` method polices and records it, it runs under the
    ``below`` guard (the dispatch keys under this kernel's), and ``bind`` keeps what its waits match."""
    def kernel(*args, **kwargs):
        recorder = active()
        records = []
        if recorder is not None and not _sends_nothing(args):
            records, args, kwargs = getattr(recorder, issue)(op, args, kwargs)
        try:
            with below():
                out = op(*args, **kwargs)
        except BaseException:
            if records:
                recorder.failed(records)
            raise
        if records:
            getattr(recorder, bind)(records, out)
        return out
    return kernel


def _traced_kernel(op):
    """In front of one c10d op, on the autograd keys: record it, then run it below autograd."""
    return _kernel(op, "issue", "bind_work", _torch.BelowAutograd)


def _functional_kernel(op):
    """In front of one functional collective, on ADInplaceOrView: below the autograd formulas torch
    registers for it, above the c10d op it runs (which is then out of every kernel's sight)."""
    return _kernel(op, "issue_functional", "bind_tensors", _torch.BelowADInplaceOrView)


def _timed(original_wait):
    """``original_wait`` (``Work.wait``, ``Future.wait``, a ``wait_tensor``), timing the op it waits on."""
    def wait(self, *args, **kwargs):
        recorder = active()
        op = recorder.waiting(self) if recorder is not None else None
        result = original_wait(self, *args, **kwargs)
        if op is not None:
            recorder.waited(op)
        return result
    return wait


def _wait_tensor_kernel(op):
    """``wait_tensor`` is how functional collectives are waited on: time it like ``Work.wait``."""
    def below_the_kernel(tensor):
        with _torch.BelowADInplaceOrView():
            return op(tensor)
    return _timed(below_the_kernel)


def _register_kernels():
    """Put a Python kernel in front of every c10d op and every functional collective.

    Only communication ops pay for it; ordinary tensor ops run at full speed.
    """
    lib = torch.library.Library("c10d", "IMPL")
    for name in KINDS:
        packet = getattr(torch.ops.c10d, name, None)
        if packet is None or "default" not in packet.overloads():
            continue
        for key in ("AutogradCPU", "AutogradCUDA"):
            lib.impl(name, _traced_kernel(packet.default), key)
    _LIBRARIES.append(lib)
    for namespace, ops in FUNCTIONAL_KINDS.items():
        lib = torch.library.Library(namespace, "IMPL")
        names = list(ops) + (["wait_tensor"] if namespace == "_c10d_functional" else [])
        for name in names:
            packet = getattr(getattr(torch.ops, namespace), name, None)
            if packet is None or "default" not in packet.overloads():
                continue   # an op this torch does not have
            kernel = _wait_tensor_kernel if name == "wait_tensor" else _functional_kernel
            lib.impl(name, kernel(packet.default), "ADInplaceOrView")
        _LIBRARIES.append(lib)


def _time_functional_waits():
    """An AsyncCollectiveTensor waits on first use, from inside its __torch_dispatch__, where the
    dispatcher runs no kernel of ours: its waits all go through ``_functional_collectives.wait_tensor``."""
    funcol = _torch.functional_collectives
    funcol.wait_tensor = functools.wraps(funcol.wait_tensor)(_timed(funcol.wait_tensor))


def _follow_group_lifetimes():
    """Know of every group as it is made, and read its counter before it is destroyed.

    Groups made by torch (new_group, new_subgroups, split_group) are registered by name; a group the
    code builds itself still runs ProcessGroup.__init__.  Destroying a group takes its counter away,
    so destroy_process_group reads and checks it first.
    """
    c10d = _torch.c10d
    original_register, original_init = c10d._register_process_group, _torch.ProcessGroup.__init__
    original_destroy = c10d.destroy_process_group

    def _register_process_group(group_name, pg):
        if active() is not None:
            active().track(pg)
        return original_register(group_name, pg)

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if active() is not None:
            active().track(self)

    @functools.wraps(original_destroy)
    def destroy_process_group(group=None):
        if active() is not None:
            try:
                active().retiring(group)
            except Exception:
                pass   # a group torch cannot destroy either: let torch say what is wrong
        return original_destroy(group)

    c10d._register_process_group = _register_process_group
    _torch.ProcessGroup.__init__ = __init__
    c10d.destroy_process_group = dist.destroy_process_group = destroy_process_group


def _record_monitored_barrier_in_python():
    original_monitored_barrier = _torch.ProcessGroup.monitored_barrier

    def monitored_barrier(self, *args, **kwargs):
        recorder = active()
        if recorder is not None:
            frame, site = recorder.site()
            recorder.policy.check("barrier", site)
            recorder._record("barrier", "c10d.monitored_barrier_.default", frame, site, self, ranks_of(self),
                             [], 0, None, None, False)
        return original_monitored_barrier(self, *args, **kwargs)

    _torch.ProcessGroup.monitored_barrier = monitored_barrier


def backend_classes() -> list:
    """The c10d backend classes this torch has: their collective methods are refused (``install``)."""
    return _torch.backend_classes()



def _refuse_backend_call(name):
    def refuse(self, *args, **kwargs):
        recorder = active()
        site = recorder.site()[1] if recorder is not None else "?"
        message = (f"{name}() was called on a Backend object directly (at {site}); the harness cannot "
                   "trace that path. Use torch.distributed's functions (dist.all_reduce, dist.isend, ...).")
        if recorder is not None:
            recorder.policy.refuse(message)
        raise ForbiddenOp(message)
    return refuse
