"""The rank's record of one call: every op as it is issued and waited on, and the marked phases.

``Recorder`` polices each op against the call's ``Policy``, records it (kind, tensors, group, the user-code
site that issued it, when it was issued and waited on), and streams every event to the test process at once
through a pipe, which builds the trace from that stream.  Its group half (``groups.GroupCounters``) checks the
groups' own op counters against the record.  ``phase`` marks a region of a rank function.  The kernels in
``kernels`` feed the one active recorder (``active()``), installed once per rank.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch
import typing_extensions

from .. import _torch
from .groups import GroupCounters, global_rank, process_group, ranks_of, resolve_group
from .compute import ComputeWatch
from .ops import (FUNCTIONAL_KINDS, IN_ARG, KINDS, OUT_ARG, functional_out_bytes, nbytes_of,
                   perturbed_copies, tensors_in, with_argument)
from ..world.diagnose import ENGINE_DIR, short_path
from .policy import Policy, ops_digest
from ..trace import P2P_KINDS, ROOTED_KINDS

_FLIGHT_LOCK = threading.Lock()
# torch, the harness, the stdlib, and typing_extensions: torch 2.13 wraps all_gather_into_tensor in its @deprecated
_SKIP_DIRS = (os.path.dirname(torch.__file__), ENGINE_DIR, os.path.dirname(threading.__file__),
              typing_extensions.__file__)


def user_frame(frame):
    """The innermost frame outside torch, the harness and the stdlib threading module."""
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_DIRS):
        frame = frame.f_back
    return frame


class Recorder(GroupCounters):
    """Holds one call's ops and phases, streams them to the test process, and keeps the group counters."""

    def __init__(self, rank: int, flight_fd: int | None, shared_dir: str | None = None):
        self.rank = rank
        self.flight_fd = flight_fd
        self.shared_dir = shared_dir   # the world's shared folder, if any (``probes.KillAt`` counts under it)
        self.policy = Policy()
        # id(ProcessGroup) -> {"pg", "start", "end", "ranks"}: every group this rank knows of, held so
        # that its counter stays readable even after the code drops or destroys it
        self.groups: dict[int, dict] = {}
        self.compute: ComputeWatch | None = None
        self.works: dict[int, tuple] = {}   # (reset's finish lets go of the waited ones)
        self.reset()

    def reset(self, policy: Policy | None = None):
        self.finish()
        self.ops: list[dict] = []
        self.phases: list[dict] = []
        self.phase_stack: list[dict] = []
        # id(Work or output tensor) -> (that object, op dict): what a wait is matched on; holding it keeps ids unique
        self.works: dict[int, tuple] = {}
        self.t0 = time.perf_counter()
        self.policy = policy or Policy()
        self.sends = 0            # point-to-point sends issued so far in this call (for ``perturb_send``)
        self.perturb_at = None    # the send that carries a changed copy (``probes.Perturb``), if any
        self.tampered = None      # the first group found out of balance with the trace when destroyed
        self.groups = self._groups_at_start()

    def count_compute(self):
        """Watch compute from now until the call ends (``probes.Compute``): fills ``compute_between`` and
        ``compute_used`` (see ``compute``)."""
        self.compute = ComputeWatch()
        self.compute.__enter__()

    def perturb_send(self, nth: int):
        """This call's ``nth`` point-to-point send (from 0) carries a changed copy (``probes.Perturb``)."""
        self.perturb_at = nth

    def finish(self, result=None, returned: bool = False):
        """The call is over: stop watching compute and, when the rank function ``returned`` ``result``, stream
        how much of each op's in-flight compute that result needed (``compute_used``).  Safe to call twice."""
        self.drop_waited()   # what the function let go of is free once it returns (RunResult.memory's end)
        watch, self.compute = self.compute, None
        if watch is None:
            return
        stack = _torch.function_mode_stack()
        if watch in stack:
            for _ in range(len(stack) - 1 - stack.index(watch)):
                _torch.pop_function_mode()   # modes the code entered and never left: they sit above ours
            watch.__exit__(None, None, None)
        needed = watch.needed_by(result) if returned else None
        for op in self.ops:
            if needed is not None and op.get("_compute_at_wait") is not None:
                first, last = op["_compute_at_issue"], op["_compute_at_wait"]
                op["compute_used"] = sum(1 for n in needed if first < n <= last)
                self.flight(ev="used", i=op["index"], op=self.exported(op))

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
        frame = user_frame(sys._getframe(2))
        if frame is None:
            return None, "<torch internals>"
        return frame, f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"

    # ---- issuing ----------------------------------------------------------------------------------

    def issue(self, func, args, kwargs):
        """A c10d op is about to run: police it, record it.  Returns ([its record], args, kwargs), no record
        for an op that is not communication; the args change only when this op is the send that ``perturb``
        names."""
        op_name = func._schema.name.split("::")[-1]
        kind = KINDS.get(op_name)
        if kind is None:
            return [], args, kwargs
        frame, site = self.site()
        self.policy.check(kind, site)
        flat = list(args) + list(kwargs.values())
        pg = process_group(next((a for a in flat if isinstance(a, torch.ScriptObject)), None))
        group = ranks_of(pg)
        ins = tensors_in(flat[IN_ARG.get(op_name, 0)])
        outs = tensors_in(flat[OUT_ARG[op_name]]) if op_name in OUT_ARG else []
        peer = None
        if kind in ("send", "recv") and op_name != "recv_any_source_":
            peer = global_rank(group, next(a for a in flat[2:] if isinstance(a, int)))
        splits = (tuple(flat[3]), tuple(flat[4])) if op_name == "alltoall_base_" else None
        root = None
        if kind in ROOTED_KINDS:   # the first int after the group: c10d's root_rank, a group rank
            after = flat[next(i for i, a in enumerate(flat) if isinstance(a, torch.ScriptObject)) + 1:]
            root = global_rank(group, next(a for a in after if type(a) is int))
        perturbed = kind == "send" and self._perturbs_next_send()
        if perturbed:   # c10d::send(Tensor[] tensors, ...): gloo's send work keeps the copy alive
            args = (perturbed_copies(args[0]),) + tuple(args[1:])
        record = self._record(kind, str(func), frame, site, pg, group, ins, nbytes_of(outs), peer, splits, perturbed,
                              root)
        return [record], args, kwargs

    def issue_functional(self, func, args, kwargs):
        """A functional collective is about to run: police it, record it (one record per send/recv of a
        ``batch_p2p_ops``).  Returns (records, args, kwargs), as ``issue`` does."""
        namespace, op_name = func._schema.name.split("::")
        kind = FUNCTIONAL_KINDS[namespace][op_name]
        names = [a.name for a in func._schema.arguments]
        bound = {**dict(zip(names, args)), **kwargs}
        frame, site = self.site()
        pg = resolve_group(bound.get("group_name"))
        group = ranks_of(pg)
        if op_name == "batch_p2p_ops":
            kinds = ["send" if what == "isend" else "recv" for what in bound["op_list"]]
            for k in kinds:
                self.policy.check(k, site)
            tensors, records = list(bound["tensors"]), []
            for i, (k, local) in enumerate(zip(kinds, bound["peer_list"])):
                perturbed = k == "send" and self._perturbs_next_send()
                ins = [tensors[i]]
                if perturbed:
                    tensors[i] = perturbed_copies(ins)[0]
                records.append(self._record(k, str(func), frame, site, pg, group, ins,
                                            0 if k == "send" else nbytes_of(ins), global_rank(group, local),
                                            None, perturbed))
            args, kwargs = with_argument(names, args, kwargs, "tensors", tensors)
            return records, args, kwargs
        self.policy.check(kind, site)
        ins = tensors_in(next((bound[n] for n in ("input", "inputs", "tensor") if n in bound), None))
        peer = global_rank(group, bound["dst"] if kind == "send" else bound["src"]) if kind in P2P_KINDS else None
        root = global_rank(group, bound["src"]) if kind == "broadcast" else None
        splits = None
        if kind == "all_to_all" and "output_split_sizes" in bound:
            splits = (tuple(int(s) for s in bound["output_split_sizes"] or ()),
                      tuple(int(s) for s in bound["input_split_sizes"] or ()))
        perturbed = kind == "send" and self._perturbs_next_send()
        if perturbed:
            args, kwargs = with_argument(names, args, kwargs, "tensor", perturbed_copies(ins)[0])
        record = self._record(kind, str(func), frame, site, pg, group, ins,
                              functional_out_bytes(kind, bound, ins, len(group)), peer, splits, perturbed, root)
        return [record], args, kwargs

    def _record(self, kind, name, frame, site, pg, group, ins, out_bytes, peer, splits, perturbed, root=None) -> dict:
        phase = self.phase_stack[-1] if self.phase_stack else None
        op = {
            "rank": self.rank, "index": len(self.ops), "kind": kind, "name": name,
            "shapes": [tuple(t.shape) for t in ins], "dtypes": [str(t.dtype) for t in ins],
            "in_bytes": 0 if kind == "recv" else nbytes_of(ins), "out_bytes": out_bytes,
            "peer": peer, "root": root, "group": tuple(group), "splits": splits,
            "phase": phase["name"] if phase else None, "step": phase["step"] if phase else None,
            "site": site, "issued_at": self.now(),
            "wait_start": None, "wait_end": None, "blocking": None,
            "compute_between": None, "compute_used": None, "perturbed": perturbed,
            # rank-local bookkeeping (never leaves the rank): where it was issued, the group it ran on,
            # and the compute count at issue
            "_frame": (id(frame), frame.f_lasti) if frame is not None else None,
            "_pg": self.track(pg),
            "_compute_at_issue": self.compute.count if self.compute is not None else None,
        }
        self.ops.append(op)
        self.flight(ev="issue", i=op["index"], op=self.exported(op))
        return op

    def _perturbs_next_send(self) -> bool:
        nth, self.sends = self.sends, self.sends + 1
        return self.perturb_at == nth

    def failed(self, records):
        """The op raised before running (gloo checks its arguments before counting): it moved no counter."""
        for op in records:
            op["_failed"] = True

    # ---- waiting ----------------------------------------------------------------------------------

    def bind_work(self, records: list, out):
        """A c10d op returns its Work: the code waits on it."""
        (op,) = records
        work = out[1] if isinstance(out, tuple) else out
        if isinstance(work, torch.ScriptObject):
            try:
                w = _torch.Work.unbox(work)
            except Exception:
                return
            self.works[id(w)] = (w, op)

    def bind_tensors(self, records: list, out):
        """A functional collective returns tensors: the code waits on them with ``wait_tensor``."""
        tensors = tensors_in(out)
        if len(records) > 1:   # batch_p2p_ops: one output per send / recv
            pairs = zip(tensors, records)
        else:
            pairs = ((t, records[0]) for t in tensors)
        for t, op in pairs:
            self.works[id(t)] = (t, op)

    def drop_waited(self):
        """Let go of each Work whose wait is recorded: the record needs it no more, and a Work keeps its tensors
        (communication buffers the code has released) alive."""
        for key, (_, op) in list(self.works.items()):
            if op.get("wait_end") is not None:
                del self.works[key]

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
        frame = user_frame(sys._getframe(2))
        op["blocking"] = op["_frame"] is not None and frame is not None and \
            (id(frame), frame.f_lasti) == op["_frame"]
        op["wait_start"] = self.now()
        if self.compute is not None and op["_compute_at_issue"] is not None:
            op["_compute_at_wait"] = self.compute.count
            op["compute_between"] = self.compute.count - op["_compute_at_issue"]
        self.flight(ev="wait", i=op["index"], op=self.exported(op))
        return op

    def waited(self, op):
        op["wait_end"] = self.now()
        self.flight(ev="done", i=op["index"], op=self.exported(op))

    @staticmethod
    def exported(op: dict) -> dict:
        """The op as the test process sees it: without the rank-local bookkeeping fields."""
        return {k: v for k, v in op.items() if not k.startswith("_")}

    def digest(self) -> str:
        """``ops_digest`` of the records as this rank holds them (the op-count check reads these)."""
        return ops_digest([self.exported(op) for op in self.ops])


_RECORDER: Recorder | None = None   # this rank's one recorder, from ``activate`` on (never in the test process)


def active() -> Recorder | None:
    """The recorder the kernels feed, or None outside a rank."""
    return _RECORDER


def activate(rank: int, flight_fd: int | None, shared_dir: str | None = None) -> Recorder:
    """Make this rank's recorder (once per rank; ``kernels.install`` calls it)."""
    global _RECORDER
    _RECORDER = Recorder(rank, flight_fd, shared_dir)
    return _RECORDER
