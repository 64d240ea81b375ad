"""Rank-side recorder of every torch.distributed op.

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
    Python's reach) then disagree with the trace.  Every group is checked: the
    ones alive at the end of the call, and each one the call destroys, at the
    moment it is destroyed (its counter goes with it).

Two measurements a call can ask for through its ``Policy``:
  * ``record_compute``: how many compute ops ran between issuing each op and
    waiting on it (``CommOp.compute_between``), for overlap properties;
  * ``perturb=(rank, n)``: rank ``rank``'s n-th point-to-point send carries a
    perturbed copy of its tensor, so a property can check that answers really
    depend on the messages.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from types import MappingProxyType

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack, _pop_mode

from .errors import ForbiddenOp, TraceTampered
from .trace import COLLECTIVE_KINDS, P2P_KINDS

_KNOWN_KINDS = frozenset(COLLECTIVE_KINDS + P2P_KINDS)
_FLIGHT_LOCK = threading.Lock()

_C10D = torch._C._distributed_c10d
_TORCH_DIR = os.path.dirname(torch.__file__)
_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_DIRS = (_TORCH_DIR, _HARNESS_DIR, os.path.dirname(threading.__file__))

# c10d op name -> normalised kind
_KINDS = MappingProxyType({
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
})
# which positional argument holds what this rank contributes / receives into
_IN_ARG = MappingProxyType({
    "allgather_": 1, "_allgather_base_": 1, "allgather_coalesced_": 1, "allgather_into_tensor_coalesced_": 1,
    "reduce_scatter_": 1, "_reduce_scatter_base_": 1, "reduce_scatter_tensor_coalesced_": 1,
    "alltoall_": 1, "alltoall_base_": 1, "gather_": 1, "scatter_": 1})
_OUT_ARG = MappingProxyType({
    "allgather_": 0, "_allgather_base_": 0, "allgather_coalesced_": 0, "allgather_into_tensor_coalesced_": 0,
    "reduce_scatter_": 0, "_reduce_scatter_base_": 0, "reduce_scatter_tensor_coalesced_": 0,
    "alltoall_": 0, "alltoall_base_": 0, "recv_": 0, "recv_any_source_": 0,
    "gather_": 0, "scatter_": 0, "allreduce_": 0, "broadcast_": 0})

# functional collectives: dispatcher namespace -> op name -> normalised kind
# (batch_p2p_ops holds several sends and receives: it gets one record per entry)
_FUNCTIONAL_KINDS = MappingProxyType({
    "_c10d_functional": MappingProxyType({
        "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
        "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
        "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
        "all_gather_into_tensor_coalesced": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_out": "reduce_scatter",
        "reduce_scatter_tensor_coalesced": "reduce_scatter",
        "all_to_all_single": "all_to_all", "broadcast": "broadcast", "broadcast_": "broadcast",
        "isend": "send", "irecv": "recv", "batch_p2p_ops": "send/recv"}),
    "_c10d_functional_autograd": MappingProxyType({
        "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
        "all_to_all_single": "all_to_all"}),
    "_dtensor": MappingProxyType({"shard_dim_alltoall": "all_to_all"}),
})

# What counts as compute for ``CommOp.compute_between``: the matmul family, which is where attention,
# MLPs and linear layers spend their time once matmul / einsum / linear are lowered to aten (mm, bmm,
# addmm, baddbmm ...), torch's fused attention kernels, and softmax / exp (ring attention's other
# step).  Element-wise arithmetic and copies do not count: an overlap property asks whether real work
# ran while a message was in flight, and a copy into a send buffer is not that.
_COMPUTE_OPS = (
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_softmax", "_log_softmax", "exp",
)
_COMPUTE_PACKETS = frozenset(getattr(torch.ops.aten, name) for name in _COMPUTE_OPS
                             if hasattr(torch.ops.aten, name))

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


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


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
    """What a call may issue, and what the harness measures or changes while it runs.

    ``forbid`` / ``allow`` name op kinds (``allow`` wins when given).  ``record_compute`` counts
    compute ops between each op's issue and its wait (``CommOp.compute_between``); it slows every
    aten op, so it is off unless asked for.  ``perturb=(rank, n)``: on rank ``rank``, the n-th
    point-to-point send (from 0, in issue order, whatever the group) carries a perturbed copy of its
    tensor (+1 on every element; ``not`` for bool); the sender's own tensor is untouched.
    """

    def __init__(self, forbid=(), allow=None, record_compute: bool = False, perturb: tuple | None = None):
        self.forbid = frozenset(forbid)
        self.allow = None if allow is None else frozenset(allow)
        unknown = sorted((self.forbid | (self.allow or frozenset())) - _KNOWN_KINDS)
        if unknown:   # a typo ("allreduce") would otherwise forbid nothing, silently
            raise ValueError(f"unknown op kind(s) {', '.join(map(repr, unknown))}; "
                             f"the kinds are: {', '.join(sorted(_KNOWN_KINDS))}")
        self.record_compute = bool(record_compute)
        if perturb is not None:
            if (not isinstance(perturb, (tuple, list)) or len(perturb) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in perturb)):
                raise ValueError(f"perturb must be (rank, nth_send), two integers >= 0; got {perturb!r}")
            perturb = (perturb[0], perturb[1])
        self.perturb = perturb
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


class _ComputeCounter(TorchDispatchMode):
    """Counts compute ops (``_COMPUTE_OPS``) as this thread runs them.  Entered only for a call whose
    policy asks for it: a dispatch mode puts every aten op through Python."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if getattr(func, "overloadpacket", None) in _COMPUTE_PACKETS:   # (higher-order ops have none)
            self.count += 1
        return func(*args, **(kwargs or {}))


class Recorder:
    """Holds one call's ops and phases, streams them to the test process, and keeps the group counters."""

    def __init__(self, rank: int, flight_fd: int | None):
        self.rank = rank
        self.flight_fd = flight_fd
        self.policy = Policy()
        # id(ProcessGroup) -> {"pg", "start", "end", "ranks"}: every group this rank knows of, held so
        # that its counter stays readable even after the code drops or destroys it
        self.groups: dict[int, dict] = {}
        self.compute_mode: _ComputeCounter | None = None
        self.reset()

    def reset(self, policy: Policy | None = None):
        self.finish()
        self.ops: list[dict] = []
        self.phases: list[dict] = []
        self.phase_stack: list[dict] = []
        # id(Work or output tensor) -> (that object, op dict): what a wait is matched on; holding the
        # object keeps its id unique
        self.works: dict[int, tuple] = {}
        self.t0 = time.perf_counter()
        self.policy = policy or Policy()
        self.sends = 0            # point-to-point sends issued so far in this call (for ``perturb``)
        self.tampered = None      # the first group found out of balance with the trace when destroyed
        self.groups = self._groups_at_start()
        if self.policy.record_compute:
            self.compute_mode = _ComputeCounter()
            self.compute_mode.__enter__()
        self.flight(ev="call")

    def finish(self):
        """The call is over: stop counting compute ops.  Safe to call twice."""
        mode, self.compute_mode = self.compute_mode, None
        if mode is None:
            return
        stack = _get_current_dispatch_mode_stack()
        if mode in stack:
            for _ in range(len(stack) - 1 - stack.index(mode)):
                _pop_mode()   # modes the code entered and never left: they sit above ours
            mode.__exit__(None, None, None)

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

    # ---- issuing ----------------------------------------------------------------------------------

    def issue(self, func, args, kwargs):
        """A c10d op is about to run: police it, record it.  Returns (record or None, args, kwargs);
        the args change only when this op is the send that ``perturb`` names."""
        op_name = func._schema.name.split("::")[-1]
        kind = _KINDS.get(op_name)
        if kind is None:
            return None, args, kwargs
        frame, site = self.site()
        self.policy.check(kind, site)
        flat = list(args) + list(kwargs.values())
        pg = _process_group(next((a for a in flat if isinstance(a, torch.ScriptObject)), None))
        group = _ranks_of(pg)
        ins = _tensors(flat[_IN_ARG.get(op_name, 0)])
        outs = _tensors(flat[_OUT_ARG[op_name]]) if op_name in _OUT_ARG else []
        peer = None
        if kind in ("send", "recv") and op_name != "recv_any_source_":
            peer = _global_rank(group, next(a for a in flat[2:] if isinstance(a, int)))
        splits = (tuple(flat[3]), tuple(flat[4])) if op_name == "alltoall_base_" else None
        perturbed = kind == "send" and self._perturbs_next_send()
        if perturbed:   # c10d::send(Tensor[] tensors, ...): gloo's send work keeps the copy alive
            args = (_perturbed_copies(args[0]),) + tuple(args[1:])
        record = self._record(kind, str(func), frame, site, pg, group, ins, _nbytes(outs), peer, splits, perturbed)
        return record, args, kwargs

    def issue_functional(self, func, args, kwargs):
        """A functional collective is about to run: police it, record it (one record per send/recv of a
        ``batch_p2p_ops``).  Returns (records, args, kwargs), as ``issue`` does."""
        namespace, op_name = func._schema.name.split("::")
        kind = _FUNCTIONAL_KINDS[namespace][op_name]
        names = [a.name for a in func._schema.arguments]
        bound = {**dict(zip(names, args)), **kwargs}
        frame, site = self.site()
        pg = _resolve_group(bound.get("group_name"))
        group = _ranks_of(pg)
        if op_name == "batch_p2p_ops":
            kinds = ["send" if what == "isend" else "recv" for what in bound["op_list"]]
            for k in kinds:
                self.policy.check(k, site)
            tensors, records = list(bound["tensors"]), []
            for i, (k, local) in enumerate(zip(kinds, bound["peer_list"])):
                perturbed = k == "send" and self._perturbs_next_send()
                ins = [tensors[i]]
                if perturbed:
                    tensors[i] = _perturbed_copies(ins)[0]
                records.append(self._record(k, str(func), frame, site, pg, group, ins,
                                            0 if k == "send" else _nbytes(ins), _global_rank(group, local),
                                            None, perturbed))
            args, kwargs = _with_argument(names, args, kwargs, "tensors", tensors)
            return records, args, kwargs
        self.policy.check(kind, site)
        ins = _tensors(next((bound[n] for n in ("input", "inputs", "tensor") if n in bound), None))
        peer = _global_rank(group, bound["dst"] if kind == "send" else bound["src"]) if kind in P2P_KINDS else None
        splits = None
        if kind == "all_to_all" and "output_split_sizes" in bound:
            splits = (tuple(int(s) for s in bound["output_split_sizes"] or ()),
                      tuple(int(s) for s in bound["input_split_sizes"] or ()))
        perturbed = kind == "send" and self._perturbs_next_send()
        if perturbed:
            args, kwargs = _with_argument(names, args, kwargs, "tensor", _perturbed_copies(ins)[0])
        record = self._record(kind, str(func), frame, site, pg, group, ins,
                              _functional_out_bytes(kind, bound, ins, len(group)), peer, splits, perturbed)
        return [record], args, kwargs

    def _record(self, kind, name, frame, site, pg, group, ins, out_bytes, peer, splits, perturbed) -> dict:
        phase = self.phase_stack[-1] if self.phase_stack else None
        op = {
            "rank": self.rank, "index": len(self.ops), "kind": kind, "name": name,
            "shapes": [tuple(t.shape) for t in ins], "dtypes": [str(t.dtype) for t in ins],
            "in_bytes": 0 if kind == "recv" else _nbytes(ins), "out_bytes": out_bytes,
            "peer": peer, "group": tuple(group), "splits": splits,
            "phase": phase["name"] if phase else None, "step": phase["step"] if phase else None,
            "site": site, "issued_at": self.now(),
            "wait_start": None, "wait_end": None, "blocking": None,
            "compute_between": None, "perturbed": perturbed,
            # rank-local bookkeeping (never leaves the rank): where it was issued, the group it ran on,
            # and the compute count at issue
            "_frame": (id(frame), frame.f_lasti) if frame is not None else None,
            "_pg": self.track(pg),
            "_compute_at_issue": self.compute_mode.count if self.compute_mode is not None else None,
        }
        self.ops.append(op)
        self.flight(ev="issue", i=op["index"], op=self.exported(op))
        return op

    def _perturbs_next_send(self) -> bool:
        nth, self.sends = self.sends, self.sends + 1
        return self.policy.perturb is not None and self.policy.perturb == (self.rank, nth)

    def failed(self, records):
        """The op raised before running (gloo checks its arguments before counting): it moved no counter."""
        for op in records:
            op["_failed"] = True

    # ---- waiting ----------------------------------------------------------------------------------

    def bind_work(self, op: dict, out):
        """A c10d op returns its Work: the code waits on it."""
        work = out[1] if isinstance(out, tuple) else out
        if isinstance(work, torch.ScriptObject):
            try:
                w = _C10D.Work.unbox(work)
            except Exception:
                return
            self.works[id(w)] = (w, op)

    def bind_tensors(self, records: list, out):
        """A functional collective returns tensors: the code waits on them with ``wait_tensor``."""
        tensors = _tensors(out)
        if len(records) > 1:   # batch_p2p_ops: one output per send / recv
            pairs = zip(tensors, records)
        else:
            pairs = ((t, records[0]) for t in tensors)
        for t, op in pairs:
            self.works[id(t)] = (t, op)

    def alias(self, work, future):
        """``work.get_future()``: waiting on the future is waiting on the work's op."""
        entry = self.works.get(id(work))
        if entry is not None and entry[0] is work:
            self.works[id(future)] = (future, entry[1])

    def waiting(self, obj):
        entry = self.works.get(id(obj))
        if entry is None and type(obj) is not torch.Tensor and isinstance(obj, torch.Tensor):
            obj = getattr(obj, "elem", None)   # an AsyncCollectiveTensor: a functional collective's output
            entry = self.works.get(id(obj))
        if entry is None or entry[0] is not obj or entry[1]["wait_start"] is not None:
            return None
        op = entry[1]
        frame = _user_frame(sys._getframe(2))
        op["blocking"] = op["_frame"] is not None and frame is not None and \
            (id(frame), frame.f_lasti) == op["_frame"]
        op["wait_start"] = self.now()
        if self.compute_mode is not None and op["_compute_at_issue"] is not None:
            op["compute_between"] = self.compute_mode.count - op["_compute_at_issue"]
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
        self.finish()
        return [self.exported(op) for op in self.ops], [dict(p) for p in self.phases]

    def digest(self) -> str:
        """``ops_digest`` of the records as this rank holds them (the op-count check reads these)."""
        return ops_digest([self.exported(op) for op in self.ops])

    # ---- the groups' own counters -----------------------------------------------------------------

    def track(self, pg) -> int | None:
        """Know of ``pg`` from now on; returns the key its ops are counted under.

        A group met for the first time during a call was created during it: its counter started at 0.
        """
        if pg is None:
            return None
        key = id(pg)
        if key not in self.groups:
            self.groups[key] = {"pg": pg, "start": 0, "end": None, "ranks": None}
        return key

    def _groups_at_start(self) -> dict:
        """Every group still alive (destroyed ones are done with), each with its counter as the call starts."""
        groups = {key: g for key, g in self.groups.items() if g["end"] is None}
        if dist.is_initialized():
            for pg in list(dist.distributed_c10d._world.pg_map):
                groups.setdefault(id(pg), {"pg": pg, "start": 0, "end": None, "ranks": None})
        for g in groups.values():
            start = _counter(g["pg"])
            g["start"] = 0 if start is None else start   # no backend to count with yet: nothing has run
        return groups

    def retiring(self, group):
        """``destroy_process_group(group)`` is about to run: read the counters it takes away and check them."""
        if group is None or group is dist.group.WORLD:
            pgs = [g["pg"] for g in self.groups.values()] + list(dist.distributed_c10d._world.pg_map)
        else:
            pgs = [group]
        traced = self._traced()
        for pg in pgs:
            if not isinstance(pg, _C10D.ProcessGroup):
                continue
            key = self.track(pg)
            g = self.groups[key]
            if g["end"] is not None:
                continue
            g["ranks"] = g["ranks"] or _known_ranks(pg)
            g["end"] = _counter(pg)
            problem = _out_of_balance(g, g["end"], *traced.get(key, (0, None)))
            if problem and self.tampered is None:
                self.tampered = problem   # stands even if the code goes on, or catches what follows

    def check_untampered(self):
        """Compare the trace with each group's own op counter (C++, out of Python's reach): groups alive
        now, read now; groups destroyed during the call, as read when they were destroyed."""
        if self.tampered:
            raise TraceTampered(self.tampered)
        traced = self._traced()
        for key, g in self.groups.items():
            end = g["end"] if g["end"] is not None else _counter(g["pg"])
            problem = _out_of_balance(g, end, *traced.get(key, (0, None)))
            if problem:
                raise TraceTampered(problem)

    def _traced(self) -> dict:
        """group key -> (how far the traced ops should have moved its counter, the ranks they name).

        Worked out from each record's public fields, the ones the test process received: code that edits
        the recorder's lists cannot make room for an untraced op without changing what they say.
        """
        traced = {}
        for op in self.ops:
            ticks, ranks = traced.get(op["_pg"], (0, op["group"]))
            group = self.groups.get(op["_pg"])
            moved = 0 if op.get("_failed") else _ticks(op, _backend_name(group["pg"]) if group else None)
            traced[op["_pg"]] = (ticks + moved, ranks)
        return traced


def _out_of_balance(g: dict, end: int | None, traced: int, traced_ranks) -> str | None:
    """What is wrong when a group's counter moved (from ``g["start"]`` to ``end``) by other than ``traced``."""
    if end is None and traced == 0:
        return None   # a group with no backend to count with has run nothing, and nothing was traced on it
    ran = "an unknown number of" if end is None else end - g["start"]
    if ran == traced:
        return None
    ranks = g["ranks"] or _known_ranks(g["pg"]) or traced_ranks
    return (f"group {_describe_group(g['pg'], ranks)} ran {ran} communication ops but the harness traced "
            f"{traced}: something bypassed the tracer (torch.inference_mode tensors, or a replaced c10d "
            "kernel, are not allowed)")


def ops_digest(ops: list) -> str:
    """A fingerprint of op records: a rank's own (``Recorder.digest``), or each op's last streamed form.

    The two agree unless code in the rank edited its recorder's records after streaming them; the
    rank's op-count check reads those records, so the test process can compare the two fingerprints.
    """
    return hashlib.sha256(json.dumps(ops, sort_keys=True).encode()).hexdigest()


def _process_group(pg_script_object):
    """The ProcessGroup a c10d op's argument stands for (the default group when it cannot be read)."""
    try:
        if pg_script_object is not None:
            return _C10D.ProcessGroup.unbox(pg_script_object)
    except Exception:
        pass
    return dist.group.WORLD


def _resolve_group(group_name):
    """The ProcessGroup a functional collective names (by name, or the group object itself)."""
    try:
        if isinstance(group_name, _C10D.ProcessGroup):
            return group_name
        if isinstance(group_name, torch.ScriptObject):
            return _C10D.ProcessGroup.unbox(group_name)
        return _C10D._resolve_process_group(group_name)
    except Exception:
        return dist.group.WORLD


def _known_ranks(pg) -> list | None:
    try:
        return dist.get_process_group_ranks(pg)
    except Exception:
        return None


def _describe_group(pg, ranks) -> str:
    """``[0, 1]``; for a group torch no longer lists, what the group object still says of itself."""
    if ranks:
        return str(list(ranks))
    try:
        return f"of {pg.size()} ranks named {pg.group_name!r}"
    except Exception:
        return "of unknown ranks"


def _ranks_of(pg) -> list:
    """The global ranks of a group, in group-rank order (the whole world when torch no longer knows it)."""
    return _known_ranks(pg) or list(range(dist.get_world_size()))


def _global_rank(group: list, local: int) -> int:
    return group[local] if 0 <= local < len(group) else local


def _counter(pg) -> int | None:
    """The group's sequence counter: how many ops its backend has run (None: no backend to ask)."""
    try:
        return pg._get_sequence_number_for_group()
    except Exception:
        return None


def _backend_name(pg) -> str | None:
    try:
        return pg.name()
    except Exception:
        return None


def _ticks(op: dict, backend: str | None) -> int:
    """How far one traced op moves its group's sequence counter, from its record alone.

    Each backend call counts one.  On gloo a few ops are several backend calls (measured with torch
    2.13; tests/test_harness_tamper.py runs every public call and checks the count stays exact):
      reduce_scatter_ (the list form)       one reduce per group member: the group's size
      reduce_scatter_tensor_coalesced(_)    one reduce_scatter per tensor
      monitored_barrier_                    on group rank 0 a recv and a send per other member,
                                            on every other member one send and one recv
    """
    if backend != "gloo":
        return 1
    op_name, size = op["name"].split(".")[1], len(op["group"])   # "c10d.reduce_scatter_.default"
    if op_name == "reduce_scatter_":
        return size
    if op_name in ("reduce_scatter_tensor_coalesced_", "reduce_scatter_tensor_coalesced"):
        return len(op["shapes"])
    if op_name == "monitored_barrier_":
        return 2 * (size - 1) if op["group"][0] == op["rank"] else 2
    return 1


def _functional_out_bytes(kind: str, bound: dict, ins: list, group_size: int) -> int:
    """Bytes a functional collective writes on this rank, known before it runs (it allocates its output)."""
    if "out" in bound:
        return _nbytes(_tensors(bound["out"]))
    nbytes = _nbytes(ins)
    if kind == "send":
        return 0
    if kind == "all_gather":
        return nbytes * group_size
    if kind == "reduce_scatter":
        return nbytes // group_size
    if kind == "all_to_all" and bound.get("output_split_sizes") and ins and ins[0].dim() > 0 and ins[0].shape[0]:
        row_bytes = nbytes // ins[0].shape[0]
        return sum(int(s) for s in bound["output_split_sizes"]) * row_bytes
    return nbytes   # all_reduce, broadcast, recv, an even all_to_all


def _with_argument(names: list, args: tuple, kwargs: dict, name: str, value):
    """(args, kwargs) with the argument called ``name`` replaced, wherever it was passed."""
    index = names.index(name)
    if index < len(args):
        return args[:index] + (value,) + args[index + 1:], kwargs
    return args, {**kwargs, name: value}


def _perturbed_copies(tensors) -> list:
    """Copies of what a send carries, each changed (+1; ``not`` for bool): the sender's tensors stay as they are."""
    copies = []
    with torch.no_grad():
        for t in tensors:
            copy = t.detach().clone()
            copies.append(copy.logical_not_() if copy.dtype == torch.bool else copy.add_(1))
    return copies


_RECORDER: Recorder | None = None
_LIBRARIES: list = []   # keeps the kernel registrations alive


_FAKE_MODE = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)


def _sends_nothing(args) -> bool:
    """Fake or meta tensors (torch.compile tracing a graph, shape checks) run no communication."""
    if _FAKE_MODE is not None and torch._C._get_dispatch_mode(_FAKE_MODE) is not None:
        return True
    return any(t.is_meta for t in _tensors(list(args)))


def _traced_kernel(op):
    """In front of one c10d op, on the autograd keys: record it, then run it below autograd."""
    def kernel(*args, **kwargs):
        recorder = _RECORDER
        record = None
        if recorder is not None and not _sends_nothing(args):
            record, args, kwargs = recorder.issue(op, args, kwargs)
        try:
            with torch._C._AutoDispatchBelowAutograd():
                out = op(*args, **kwargs)
        except BaseException:
            if record is not None:
                recorder.failed([record])
            raise
        if record is not None:
            recorder.bind_work(record, out)
        return out
    return kernel


def _functional_kernel(op):
    """In front of one functional collective, on ADInplaceOrView: below the autograd formulas torch
    registers for it, above the c10d op it runs (which is then out of every kernel's sight)."""
    def kernel(*args, **kwargs):
        recorder = _RECORDER
        records = []
        if recorder is not None and not _sends_nothing(args):
            records, args, kwargs = recorder.issue_functional(op, args, kwargs)
        try:
            with torch._C._AutoDispatchBelowADInplaceOrView():
                out = op(*args, **kwargs)
        except BaseException:
            if records:
                recorder.failed(records)
            raise
        if records:
            recorder.bind_tensors(records, out)
        return out
    return kernel


def _wait_tensor_kernel(op):
    """``wait_tensor`` is how functional collectives are waited on: time it like ``Work.wait``."""
    def kernel(tensor):
        record = _RECORDER.waiting(tensor) if _RECORDER is not None else None
        with torch._C._AutoDispatchBelowADInplaceOrView():
            out = op(tensor)
        if record is not None:
            _RECORDER.waited(record)
        return out
    return kernel


def _register_kernels():
    """Put a Python kernel in front of every c10d op and every functional collective.

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
    for namespace, ops in _FUNCTIONAL_KINDS.items():
        lib = torch.library.Library(namespace, "IMPL")
        names = list(ops) + (["wait_tensor"] if namespace == "_c10d_functional" else [])
        for name in names:
            packet = getattr(getattr(torch.ops, namespace), name, None)
            if packet is None or "default" not in packet.overloads():
                continue   # an op this torch does not have
            kernel = _wait_tensor_kernel if name == "wait_tensor" else _functional_kernel
            lib.impl(name, kernel(packet.default), "ADInplaceOrView")
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

    # code that waits on a Work's future (comm hooks, all_reduce_coalesced(async_op=True)) waits on its op too
    original_get_future, original_future_wait = _C10D.Work.get_future, torch._C.Future.wait

    def get_future(self, *args, **kwargs):
        future = original_get_future(self, *args, **kwargs)
        if _RECORDER is not None:
            _RECORDER.alias(self, future)
        return future

    def future_wait(self, *args, **kwargs):
        op = _RECORDER.waiting(self) if _RECORDER is not None else None
        result = original_future_wait(self, *args, **kwargs)
        if op is not None:
            _RECORDER.waited(op)
        return result

    _C10D.Work.get_future, torch._C.Future.wait = get_future, future_wait

    for cls in _backend_classes():
        for name in _BACKEND_METHODS:
            if hasattr(cls, name):
                setattr(cls, name, _refuse_backend_call(name))

    if getattr(torch.ops.c10d, "monitored_barrier_", None) is None:
        _record_monitored_barrier_in_python()   # a torch whose ProcessGroup calls its backend directly

    _time_functional_waits()
    _follow_group_lifetimes()
    return _RECORDER


def _time_functional_waits():
    """An AsyncCollectiveTensor waits on first use, from inside its __torch_dispatch__, where the
    dispatcher runs no kernel of ours: its waits all go through ``_functional_collectives.wait_tensor``."""
    import torch.distributed._functional_collectives as funcol
    original_wait_tensor = funcol.wait_tensor

    @functools.wraps(original_wait_tensor)
    def wait_tensor(tensor):
        op = _RECORDER.waiting(tensor) if _RECORDER is not None else None
        out = original_wait_tensor(tensor)
        if op is not None:
            _RECORDER.waited(op)
        return out

    funcol.wait_tensor = wait_tensor


def _follow_group_lifetimes():
    """Know of every group as it is made, and read its counter before it is destroyed.

    Groups made by torch (new_group, new_subgroups, split_group) are registered by name; a group the
    code builds itself still runs ProcessGroup.__init__.  Destroying a group takes its counter away,
    so destroy_process_group reads and checks it first.
    """
    c10d = dist.distributed_c10d
    original_register, original_init = c10d._register_process_group, _C10D.ProcessGroup.__init__
    original_destroy = c10d.destroy_process_group

    def _register_process_group(group_name, pg):
        if _RECORDER is not None:
            _RECORDER.track(pg)
        return original_register(group_name, pg)

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if _RECORDER is not None:
            _RECORDER.track(self)

    @functools.wraps(original_destroy)
    def destroy_process_group(group=None):
        if _RECORDER is not None:
            try:
                _RECORDER.retiring(group)
            except Exception:
                pass   # a group torch cannot destroy either: let torch say what is wrong
        return original_destroy(group)

    c10d._register_process_group = _register_process_group
    _C10D.ProcessGroup.__init__ = __init__
    c10d.destroy_process_group = dist.destroy_process_group = destroy_process_group


def _record_monitored_barrier_in_python():
    original_monitored_barrier = _C10D.ProcessGroup.monitored_barrier

    def monitored_barrier(self, *args, **kwargs):
        if _RECORDER is not None:
            frame, site = _RECORDER.site()
            _RECORDER.policy.check("barrier", site)
            _RECORDER._record("barrier", "c10d.monitored_barrier_.default", frame, site, self, _ranks_of(self),
                              [], 0, None, None, False)
        return original_monitored_barrier(self, *args, **kwargs)

    _C10D.ProcessGroup.monitored_barrier = monitored_barrier


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


def _memory_pieces(harness) -> list:
    """What ``harness.memory`` measures with: a learner who swaps any of it could hide state."""
    from . import memory
    pieces = [(memory, n) for n, v in vars(memory).items()
              if callable(v) and getattr(v, "__module__", None) == memory.__name__ and not isinstance(v, type)]
    pieces += [(memory, n) for n in ("_get_objects", "_collect", "_freeze_count", "_unfreeze", "_weak_ref", "_sleep",
                                     "_Tensor", "_UntypedStorage", "_tensor_storage", "_tensor_grad", "_tensor_detach",
                                     "_storage_nbytes", "_storage_data_ptr", "_storage_device", "_no_torch_function",
                                     "saved_tensors_hooks", "compress", "_SETTLE", "_tracer") if hasattr(memory, n)]
    pieces += [(cls, n) for cls in (memory.Storages, memory.SavedForBackward, memory.Held)
               for n in vars(cls) if not n.startswith("__")]
    pieces += [(harness, n) for n in ("live_tensor_bytes", "live_storages", "saved_for_backward")]
    hooks = torch.autograd.graph.saved_tensors_hooks
    pieces += [(hooks, "__enter__"), (hooks, "__exit__"),
               (torch._C._autograd, "_push_saved_tensors_default_hooks"),
               (torch._C._autograd, "_pop_saved_tensors_default_hooks")]
    return pieces


def integrity_snapshot():
    """Remember every piece of the tracer; the returned check raises TraceTampered if any was replaced.

    The rank loop takes it before learner code runs and keeps it in a local
    variable, so replacing a method, a module attribute or a function's code
    object is caught after the call.
    """
    import harness
    module = sys.modules[__name__]
    c10d = dist.distributed_c10d
    pieces = [(cls, n) for cls in (Recorder, Policy, _ComputeCounter) for n, v in vars(cls).items()
              if callable(v) and not n.startswith("__")]
    pieces += [(_ComputeCounter, "__torch_dispatch__")]
    pieces += [(_C10D.Work, "wait"), (_C10D.Work, "get_future"), (torch._C.Future, "wait"),
               (_C10D.ProcessGroup, "monitored_barrier"), (_C10D.ProcessGroup, "__init__"),
               (c10d, "_register_process_group"), (c10d, "destroy_process_group"), (dist, "destroy_process_group"),
               (sys.modules["torch.distributed._functional_collectives"], "wait_tensor")]
    pieces += [(module, n) for n, v in vars(module).items()
               if callable(v) and getattr(v, "__module__", None) == __name__ and not isinstance(v, type)]
    pieces += [(module, n) for n in ("_RECORDER", "_KINDS", "_IN_ARG", "_OUT_ARG", "_FUNCTIONAL_KINDS",
                                     "_COMPUTE_PACKETS", "_FAKE_MODE")]
    pieces += [(cls, n) for cls in _backend_classes() for n in _BACKEND_METHODS if n in vars(cls)]
    # what the op-count check reads: a Python stand-in for the C++ counter could say anything
    pieces += [(cls, n) for cls in (_C10D.ProcessGroup, *_backend_classes())
               for n in ("_get_sequence_number_for_group", "name") if n in vars(cls)]
    pieces += _memory_pieces(harness)
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
