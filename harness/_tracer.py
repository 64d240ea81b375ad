"""Rank-side recorder of every torch.distributed op.

Why the dispatcher: every public path to a collective -- ``dist.all_reduce``,
``from torch.distributed import all_reduce``, ``distributed_c10d.*``,
``ProcessGroup.allreduce`` and the C++ reducer inside DistributedDataParallel --
ends in a ``c10d::*`` dispatcher op.  A Python kernel registered for those ops
on the autograd keys sees each one, and ordinary tensor ops pay nothing (a
``TorchDispatchMode`` would see them too, but slows every aten op ~2.5x).

The paths that skip that kernel are closed another way:
  * calling a ``Backend`` object's methods directly is refused (patched here);
  * ``monitored_barrier`` is recorded by a patch of ``ProcessGroup``;
  * anything else (functional collectives, inference-mode tensors, a learner
    who re-registers the kernel) is caught after the call, because gloo's own
    per-group sequence counter (C++, out of Python's reach) then disagrees with
    the number of ops traced.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from .errors import ForbiddenOp, TraceTampered
from .trace import COLLECTIVE_KINDS, P2P_KINDS

_KNOWN_KINDS = frozenset(COLLECTIVE_KINDS + P2P_KINDS)
_FLIGHT_LOCK = threading.Lock()

_C10D = torch._C._distributed_c10d
_TORCH_DIR = os.path.dirname(torch.__file__)
_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_DIRS = (_TORCH_DIR, _HARNESS_DIR, os.path.dirname(threading.__file__))

# c10d op name -> normalised kind
_KINDS = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "broadcast_": "broadcast",
    "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "barrier": "barrier", "monitored_barrier_": "barrier",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter",
}
# which positional argument holds what this rank contributes / receives into
_IN_ARG = {"allgather_": 1, "_allgather_base_": 1, "allgather_coalesced_": 1,
           "allgather_into_tensor_coalesced_": 1, "reduce_scatter_": 1,
           "_reduce_scatter_base_": 1, "reduce_scatter_tensor_coalesced_": 1,
           "alltoall_": 1, "alltoall_base_": 1, "gather_": 1, "scatter_": 1}
_OUT_ARG = {"allgather_": 0, "_allgather_base_": 0, "allgather_coalesced_": 0,
            "allgather_into_tensor_coalesced_": 0, "reduce_scatter_": 0,
            "_reduce_scatter_base_": 0, "reduce_scatter_tensor_coalesced_": 0,
            "alltoall_": 0, "alltoall_base_": 0, "recv_": 0, "recv_any_source_": 0,
            "gather_": 0, "scatter_": 0, "allreduce_": 0, "broadcast_": 0}

_BACKEND_METHODS = (
    "allreduce", "allreduce_coalesced", "broadcast", "allgather", "_allgather_base",
    "allgather_coalesced", "reduce_scatter", "_reduce_scatter_base", "alltoall",
    "alltoall_base", "send", "recv", "recv_anysource", "reduce", "gather", "scatter",
    "barrier", "monitored_barrier",
)


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _short_path(path: str) -> str:
    """Relative to the working directory when inside it: messages stay readable."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _user_frame(frame):
    """The innermost frame outside torch, the harness and the stdlib threading module."""
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = frame.f_back
    return frame


class Policy:
    """Which op kinds a call may issue.  ``allow`` wins when given."""

    def __init__(self, forbid=(), allow=None):
        self.forbid = frozenset(forbid)
        self.allow = None if allow is None else frozenset(allow)
        unknown = sorted((self.forbid | (self.allow or frozenset())) - _KNOWN_KINDS)
        if unknown:   # a typo ("allreduce") would otherwise forbid nothing, silently
            raise ValueError(f"unknown op kind(s) {', '.join(map(repr, unknown))}; "
                             f"the kinds are: {', '.join(sorted(_KNOWN_KINDS))}")
        self.refused = None   # the first refusal's message: the call fails even if the code catches it

    def check(self, kind: str, site: str):
        refused = kind in self.forbid or (self.allow is not None and kind not in self.allow)
        if refused:
            allowed = sorted(self.allow) if self.allow is not None else None
            hint = f" Allowed here: {', '.join(allowed)}." if allowed else ""
            self.refuse(f"{kind} is not allowed in this problem (called at {site}).{hint}")

    def refuse(self, message: str):
        if self.refused is None:
            self.refused = message
        raise ForbiddenOp(message)


class Recorder:
    """Holds one call's ops and phases; also mirrors them into the flight file."""

    def __init__(self, rank: int, flight_fd: int | None):
        self.rank = rank
        self.flight_fd = flight_fd
        self.policy = Policy()
        self.reset()

    def reset(self, policy: Policy | None = None):
        self.ops: list[dict] = []
        self.phases: list[dict] = []
        self.phase_stack: list[dict] = []
        self.works: dict[int, tuple] = {}   # id(Work) -> (Work, op dict); keeps Work alive so ids stay unique
        self.t0 = time.perf_counter()
        self.policy = policy or Policy()
        self.seq_start = _sequence_numbers()
        self.flight(ev="call")

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def flight(self, **event):
        """Stream one event to the test process at once (a pipe): what is sent cannot be taken back, and
        the test process builds its trace from this stream, not from the rank's own lists."""
        if self.flight_fd is not None:
            data = (json.dumps(event) + "\n").encode()
            with _FLIGHT_LOCK:   # autograd threads issue ops too: lines must not interleave
                while data:
                    data = data[os.write(self.flight_fd, data):]

    def site(self):
        frame = _user_frame(sys._getframe(2))
        if frame is None:
            return None, "<torch internals>"
        return frame, f"{_short_path(frame.f_code.co_filename)}:{frame.f_lineno}"

    def issue(self, func, args, kwargs) -> dict | None:
        op_name = func._schema.name.split("::")[-1]
        kind = _KINDS.get(op_name)
        if kind is None:
            return None
        frame, site = self.site()
        self.policy.check(kind, site)
        args = list(args) + list(kwargs.values())
        pg = next((a for a in args if isinstance(a, torch.ScriptObject)), None)
        group = _group_ranks(pg)
        ins = _tensors(args[_IN_ARG.get(op_name, 0)])
        outs = _tensors(args[_OUT_ARG[op_name]]) if op_name in _OUT_ARG else []
        peer = None
        if kind in ("send", "recv") and op_name != "recv_any_source_":
            local = next(a for a in args[2:] if isinstance(a, int))
            peer = group[local] if local < len(group) else local
        splits = None
        if op_name == "alltoall_base_":
            splits = (tuple(args[3]), tuple(args[4]))
        phase = self.phase_stack[-1] if self.phase_stack else None
        op = {
            "rank": self.rank, "index": len(self.ops), "kind": kind, "name": str(func),
            "shapes": [tuple(t.shape) for t in ins], "dtypes": [str(t.dtype) for t in ins],
            "in_bytes": 0 if kind == "recv" else sum(t.numel() * t.element_size() for t in ins),
            "out_bytes": sum(t.numel() * t.element_size() for t in outs),
            "peer": peer, "group": tuple(group), "splits": splits,
            "phase": phase["name"] if phase else None, "step": phase["step"] if phase else None,
            "site": site, "issued_at": self.now(),
            "wait_start": None, "wait_end": None, "blocking": None,
            "_frame": (id(frame), frame.f_lasti) if frame is not None else None,
            "_pg": _group_name(pg),
        }
        self.ops.append(op)
        self.flight(ev="issue", i=op["index"], op=self.exported(op))
        return op

    def bind(self, op: dict, out):
        work = out[1] if isinstance(out, tuple) else out
        if isinstance(work, torch.ScriptObject):
            try:
                w = _C10D.Work.unbox(work)
            except Exception:
                return
            self.works[id(w)] = (w, op)

    def waiting(self, work):
        entry = self.works.get(id(work))
        if entry is None or entry[1]["wait_start"] is not None:
            return None
        op = entry[1]
        frame = _user_frame(sys._getframe(2))
        op["blocking"] = op["_frame"] is not None and frame is not None and \
            (id(frame), frame.f_lasti) == op["_frame"]
        op["wait_start"] = self.now()
        self.flight(ev="wait", i=op["index"], op=self.exported(op))
        return op

    def waited(self, op):
        op["wait_end"] = self.now()
        self.flight(ev="done", i=op["index"], op=self.exported(op))

    @staticmethod
    def exported(op: dict) -> dict:
        """The op as the test process sees it: without the rank-local bookkeeping fields."""
        return {k: v for k, v in op.items() if not k.startswith("_")}

    def export(self):
        return [self.exported(op) for op in self.ops], [dict(p) for p in self.phases]

    def check_untampered(self):
        """Compare traced op counts with gloo's own sequence counters (C++, out of Python's reach)."""
        traced = {}
        for op in self.ops:
            if op["name"] != "monitored_barrier":
                traced[op["_pg"]] = traced.get(op["_pg"], 0) + 1
        for name, (group, before) in _sequence_numbers().items():
            start = self.seq_start.get(name, (None, 0))[1]
            ran = before - start
            if ran != traced.get(name, 0):
                raise TraceTampered(
                    f"group {list(group)} ran {ran} communication ops but the harness traced "
                    f"{traced.get(name, 0)}: something bypassed the tracer (functional collectives, "
                    "torch.inference_mode tensors, or a replaced c10d kernel are not allowed)")


def _group_ranks(pg_script_object) -> list:
    if pg_script_object is None:
        return list(range(dist.get_world_size()))
    try:
        pg = _C10D.ProcessGroup.unbox(pg_script_object)
        return dist.get_process_group_ranks(pg)
    except Exception:
        return list(range(dist.get_world_size()))


def _group_name(pg_script_object) -> str | None:
    """The unique name of the group an op ran on (two groups may hold the same ranks)."""
    try:
        if pg_script_object is None:
            return dist.group.WORLD.group_name
        return _C10D.ProcessGroup.unbox(pg_script_object).group_name
    except Exception:
        return None


def _sequence_numbers() -> dict:
    """group name -> (its global ranks, gloo's count of ops run on it so far)."""
    if not dist.is_initialized():
        return {}
    out = {}
    for pg in list(dist.distributed_c10d._world.pg_map):
        try:
            out[pg.group_name] = (tuple(dist.get_process_group_ranks(pg)), pg._get_sequence_number_for_group())
        except Exception:
            continue
    return out


_RECORDER: Recorder | None = None
_LIBRARIES: list = []   # keeps the kernel registrations alive


def _traced_kernel(op):
    def kernel(*args, **kwargs):
        record = _RECORDER.issue(op, args, kwargs) if _RECORDER is not None else None
        with torch._C._AutoDispatchBelowAutograd():
            out = op(*args, **kwargs)
        if record is not None:
            _RECORDER.bind(record, out)
        return out
    return kernel


def _register_kernels():
    """Put a Python kernel in front of every c10d op, on the autograd keys.

    Only communication ops pay for it; ordinary tensor ops run at full speed.
    """
    lib = torch.library.Library("c10d", "IMPL")
    for name in _KINDS:
        packet = getattr(torch.ops.c10d, name, None)
        if packet is None or "default" not in packet.overloads():
            continue
        for key in ("AutogradCPU", "AutogradCUDA"):
            lib.impl(name, _traced_kernel(packet.default), key)
    _LIBRARIES.append(lib)


def install(rank: int, flight_fd: int | None) -> Recorder:
    """Patch the Python-visible paths that skip the dispatcher.  Called once per rank."""
    global _RECORDER
    _RECORDER = Recorder(rank, flight_fd)
    _register_kernels()

    original_wait = _C10D.Work.wait

    def wait(self, *args, **kwargs):
        op = _RECORDER.waiting(self) if _RECORDER is not None else None
        result = original_wait(self, *args, **kwargs)
        if op is not None:
            _RECORDER.waited(op)
        return result

    _C10D.Work.wait = wait

    for cls in _backend_classes():
        for name in _BACKEND_METHODS:
            if hasattr(cls, name):
                setattr(cls, name, _refuse_backend_call(name))

    original_monitored_barrier = _C10D.ProcessGroup.monitored_barrier

    def monitored_barrier(self, *args, **kwargs):
        if _RECORDER is not None:
            _RECORDER.policy.check("barrier", _RECORDER.site()[1])
            _RECORDER.ops.append({
                "rank": _RECORDER.rank, "index": len(_RECORDER.ops), "kind": "barrier",
                "name": "monitored_barrier", "shapes": [], "dtypes": [], "in_bytes": 0,
                "out_bytes": 0, "peer": None, "group": tuple(dist.get_process_group_ranks(self)),
                "splits": None, "phase": None, "step": None, "site": _RECORDER.site()[1],
                "issued_at": _RECORDER.now(), "wait_start": None, "wait_end": None,
                "blocking": None, "_frame": None})
            _RECORDER.flight(ev="issue", i=len(_RECORDER.ops) - 1, op=_RECORDER.exported(_RECORDER.ops[-1]))
        return original_monitored_barrier(self, *args, **kwargs)

    _C10D.ProcessGroup.monitored_barrier = monitored_barrier
    return _RECORDER


def _backend_classes():
    names = ("Backend", "ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupMPI", "ProcessGroupUCC")
    return [getattr(_C10D, n) for n in names if hasattr(_C10D, n)]


def _refuse_backend_call(name):
    def refuse(self, *args, **kwargs):
        site = _RECORDER.site()[1] if _RECORDER is not None else "?"
        message = (f"{name}() was called on a Backend object directly (at {site}); the harness cannot "
                   "trace that path. Use torch.distributed's functions (dist.all_reduce, dist.isend, ...).")
        if _RECORDER is not None:
            _RECORDER.policy.refuse(message)
        raise ForbiddenOp(message)
    return refuse


def integrity_snapshot():
    """Remember every piece of the tracer; the returned check raises TraceTampered if any was replaced.

    The rank loop takes it before learner code runs and keeps it in a local
    variable, so replacing a method, a module attribute or a function's code
    object is caught after the call.
    """
    import harness
    pieces = [(Recorder, n) for n in vars(Recorder) if callable(vars(Recorder)[n]) and not n.startswith("__")]
    pieces += [(Policy, "check"), (_C10D.Work, "wait"), (_C10D.ProcessGroup, "monitored_barrier")]
    module = sys.modules[__name__]
    pieces += [(module, n) for n in ("_traced_kernel", "_user_frame", "_group_ranks", "_group_name",
                                     "_sequence_numbers", "phase", "_RECORDER", "_tensors", "_short_path")]
    pieces += [(cls, n) for cls in _backend_classes() for n in _BACKEND_METHODS if n in vars(cls)]
    snapshot = [(owner, name, getattr(owner, name), getattr(getattr(owner, name), "__code__", None))
                for owner, name in pieces]
    recorder, recorder_fields = _RECORDER, set(vars(_RECORDER))
    harness_phase = getattr(harness, "phase")

    def verify():
        for owner, name, value, code in snapshot:
            now = getattr(owner, name, None)
            if now is not value or getattr(now, "__code__", None) is not code:
                raise TraceTampered(f"the harness's tracer was modified ({getattr(owner, '__name__', owner)}.{name})")
        if getattr(harness, "phase") is not harness_phase or module._RECORDER is not recorder:
            raise TraceTampered("the harness's tracer was modified (harness.phase or the recorder)")
        if set(vars(recorder)) - recorder_fields:
            raise TraceTampered("the harness's tracer was modified (the recorder's methods were shadowed)")
    return verify


@contextmanager
def phase(name: str, step: int | None = None):
    """Mark a region of a rank function, e.g. ``with phase("backward", step=k): loss.backward()``.

    Every op issued inside carries the innermost phase's name and step.
    """
    if _RECORDER is None:
        yield
        return
    span = {"rank": _RECORDER.rank, "name": name, "step": step, "start": _RECORDER.now(), "end": None}
    _RECORDER.phases.append(span)
    _RECORDER.phase_stack.append(span)
    index = len(_RECORDER.phases) - 1
    _RECORDER.flight(ev="phase", k=index, span=dict(span))
    try:
        yield
    finally:
        _RECORDER.phase_stack.remove(span)
        span["end"] = _RECORDER.now()
        _RECORDER.flight(ev="phase", k=index, span=dict(span))
