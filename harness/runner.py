"""Run a function on N real torch.distributed ranks and get back each rank's value and trace.

Ranks are forked from a forkserver that has torch preloaded, form one process
group, and stay alive between calls: a call costs a few milliseconds, not the
seconds of a fresh ``mp.spawn``.  Any failure retires the whole world; the next
call builds a fresh one.
"""
from __future__ import annotations

import atexit
import json
import multiprocessing.connection as mpc
from multiprocessing import popen_forkserver, spawn
import importlib
import io
import os
import pickle
import shutil
import signal
import sys
import tempfile
import dataclasses
import time
import types
from collections import ChainMap
from contextlib import contextmanager
from dataclasses import dataclass

import cloudpickle

from . import _diagnose, timeline, wire
from ._boot import CONTEXT
from ._tracer import Policy, ops_digest
from .errors import (ForbiddenOp, HangError, HangStopped, NotImplementedYet, RankCrashed, RankError, TraceTampered,
                     raised_by_stub)
from .trace import CommOp, PhaseSpan, Trace

DEFAULT_TIMEOUT = float(os.environ.get("HARNESS_TIMEOUT", "5"))
_START_TIMEOUT = 60.0
_WATCH_INTERVAL = 0.05   # how often a call in progress reads its ranks' resident memory
_GB = 2**30


def default_memory_limit_gb(world_size: int) -> float:
    """Each rank's resident-memory limit: HARNESS_RANK_MEMORY_GB, else the smaller of 8 GB and
    three quarters of this machine's memory shared by the world's ranks (a runaway submission
    usually runs away on every rank at once)."""
    override = os.environ.get("HARNESS_RANK_MEMORY_GB")
    if override:
        return float(override)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / _GB
    return min(8.0, 0.75 * physical / world_size)


def resident_bytes(pid: int) -> int:
    """A process's resident set size, from /proc (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
_CTX = CONTEXT


class _Popen(popen_forkserver.Popen):
    """Forkserver launch that does not re-run the caller's main module in each rank.

    Plain multiprocessing re-imports ``__main__`` in the child (spawn semantics),
    which would re-run judge.py, pytest or a learner's script in every rank.
    """

    def _launch(self, process_obj):
        real = spawn.get_preparation_data

        def without_main(name):
            data = real(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            super()._launch(process_obj)
        finally:
            spawn.get_preparation_data = real


class _RankProcess(_CTX.Process):
    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


class PerRank:
    """An argument that differs by rank: rank r receives ``values[r]`` and never sees the others.

    ``harness.run(fn, 4, target, harness.per_rank(shards))`` calls ``fn(target, shards[r])`` on rank r,
    so one rank's code cannot read another rank's inputs (or derive the answer from them).
    """

    def __init__(self, values):
        self.values = list(values)

    def __repr__(self):
        return f"per_rank({self.values!r})"


def per_rank(values) -> PerRank:
    return PerRank(values)


def _own_inputs(args, kwargs, rank: int, world_size: int):
    """This rank's view of a call's arguments: each ``PerRank`` replaced by its own entry."""
    def own(value):
        if not isinstance(value, PerRank):
            return value
        if len(value.values) != world_size:
            raise ValueError(f"per_rank(...) holds {len(value.values)} values for a world of {world_size} ranks")
        return _without_shared_storage(value.values[rank])
    return tuple(own(a) for a in args), {k: own(v) for k, v in kwargs.items()}


def _without_shared_storage(value):
    """A view pickles its whole storage: a rank handed ``x.chunk(4)[r]`` would receive every chunk.
    Views that do not span their storage travel as copies of just their elements."""
    if isinstance(value, (list, tuple)):
        items = [_without_shared_storage(v) for v in value]
        return type(value)(items) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: _without_shared_storage(v) for k, v in value.items()}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.layout == torch.strided:
        if value.untyped_storage().nbytes() > value.numel() * value.element_size():
            return value.detach().clone().requires_grad_(value.requires_grad) if value.is_leaf else value.clone()
    return value


@dataclass
class RunResult:
    values: list          # each rank's return value, by rank
    trace: Trace

    def __iter__(self):   # allows ``values, trace = harness.run(...)``
        return iter((self.values, self.trace))


def pick_backend(world_size: int, backend: str = "auto") -> str:
    if backend != "auto":
        return backend
    try:
        import torch
        if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
            return "nccl"
    except Exception:
        pass
    return "gloo"


class World:
    """N live rank processes in one process group, fed tasks over pipes."""

    def __init__(self, world_size: int, backend: str):
        self.world_size, self.backend = world_size, backend
        self.dir = tempfile.mkdtemp(prefix=f"harness-n{world_size}-")
        self.files = [{k: os.path.join(self.dir, f"rank{r}.{k}") for k in ("stderr", "stack", "tmp")}
                      for r in range(world_size)]
        self.conns, self.procs = [], []
        self.records = [_RecordStream() for _ in range(world_size)]   # each rank's ops, streamed as issued
        self.sent_fns = set()
        self.over_memory: dict[int, tuple] = {}   # rank -> (bytes used, limit) when the watchdog ended it
        store = os.path.join(self.dir, "store")
        for r in range(world_size):
            parent, child = _CTX.Pipe()
            p = _RankProcess(target=_rank_entry, args=(r, world_size, backend, store, child,
                                                       self.records[r].writer, self.files[r]),
                             daemon=True, name=f"harness-rank{r}")
            p.start()
            child.close()
            self.records[r].started()
            self.conns.append(parent)
            self.procs.append(p)
        deadline = time.monotonic() + _START_TIMEOUT
        for r, c in enumerate(self.conns):
            try:
                ready = c.poll(max(0.0, deadline - time.monotonic())) and c.recv_bytes() == b"ready"
            except (EOFError, OSError):   # it died before saying ready: say how, with its stderr
                ready = False
            if not ready:
                self.procs[r].join(1.0)
                code, stderr = self.procs[r].exitcode, self._stderr(r)
                self.kill()
                how = "did not start within {:g} s".format(_START_TIMEOUT) if code is None else "failed to start"
                message = _diagnose.crash_message(r, code, stderr).replace(f"rank {r} ", f"rank {r} {how}: ", 1)
                raise RankCrashed(message, r, code, stderr)

    def close(self):
        for c in self.conns:
            try:
                c.send_bytes(b"stop")
            except Exception:
                pass
        deadline = time.monotonic() + 1.0
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for c in self.conns:
            c.close()
        for stream in self.records:
            stream.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.procs, self.conns = [], []

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(2.0)
        self.close()

    def _stderr(self, rank: int, limit: int = 4000) -> str:
        try:
            with open(self.files[rank]["stderr"], errors="replace") as f:
                return f.read()[-limit:]
        except OSError:
            return ""


    def _stacks(self) -> list:
        """Each rank's Python stack, dumped by faulthandler on SIGUSR1 (works while blocked in gloo)."""
        sizes = []
        for r, p in enumerate(self.procs):
            sizes.append(_size(self.files[r]["stack"]))
            if p.is_alive():
                os.kill(p.pid, signal.SIGUSR1)
        # Wait until each live rank's dump has appeared and stopped growing: on a loaded machine a
        # fixed short sleep can read a rank's dump before it is written, losing its blocking line.
        alive = [r for r, p in enumerate(self.procs) if p.is_alive()]
        last, deadline = {}, time.monotonic() + 1.0   # stays inside the timeout + 2 s promise
        while alive and time.monotonic() < deadline:
            time.sleep(0.02)
            now = {r: _size(self.files[r]["stack"]) for r in alive}
            if all(now[r] > sizes[r] and now[r] == last.get(r) for r in alive):
                break
            last = now
        stacks = []
        for r in range(self.world_size):
            try:
                with open(self.files[r]["stack"], errors="replace") as f:
                    f.seek(sizes[r])
                    stacks.append(f.read())
            except OSError:
                stacks.append("")
        return stacks

    def watch_memory(self, limit_gb: float):
        """End any rank whose resident memory is over the limit; the call then reports it as a crash."""
        for r, p in enumerate(self.procs):
            used = resident_bytes(p.pid)
            if used > limit_gb * _GB and p.is_alive():
                self.over_memory[r] = (used, limit_gb)
                p.kill()

    def call(self, fn, args, kwargs, policy: Policy, timeout: float, memory_gb: float) -> RunResult:
        # Pickling a function by value scans sys.modules (~4 ms); ship each one once per world.
        fn_key = _FN_KEYS.setdefault(fn, len(_FN_KEYS))
        token = os.urandom(16)  # a reply without it was not written by the rank loop
        try:
            fn_bytes = None if fn_key in self.sent_fns else _dump_function(fn)
            payloads = [_dumps((token, fn_key, fn_bytes, *_own_inputs(args, kwargs, r, self.world_size), policy))
                        for r in range(self.world_size)]
        except Exception as e:
            error = TypeError(f"harness.run cannot send {getattr(fn, '__qualname__', fn)} and its arguments "
                              f"to the ranks: {type(e).__name__}: {e}")
            error.world_reusable = True   # nothing was sent: the world is as it was
            raise error from e
        self.sent_fns.add(fn_key)
        for stream in self.records:
            stream.drain()
            stream.clear()
        for c, payload in zip(self.conns, payloads):
            c.send_bytes(payload)
        replies: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        first_error_at = None
        pending = {c: r for r, c in enumerate(self.conns)}
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        streams = {stream.reader: stream for stream in self.records}
        while pending:
            wait_until = deadline if first_error_at is None else min(deadline, first_error_at + 0.3)
            left = wait_until - time.monotonic()
            ready = mpc.wait(list(pending) + list(sentinels) + list(streams), max(0.0, min(left, _WATCH_INTERVAL)))
            for obj in [o for o in ready if o in streams]:
                streams[obj].drain()   # a full pipe would block the rank: read as it comes
            if not ready:
                if left <= _WATCH_INTERVAL:
                    break
                self.watch_memory(memory_gb)
                continue
            for obj in ready:
                if obj in streams:
                    continue
                if obj in sentinels:
                    r = sentinels.pop(obj)
                    obj = self.conns[r]
                    if obj not in pending:
                        continue
                    if not obj.poll():
                        raise self._crash(r)
                if obj in pending:
                    r = pending[obj]
                    try:
                        replies[r] = self._reply(r, obj.recv_bytes(), token)
                    except (EOFError, OSError):
                        # The pipe closed without a reply: the rank died.  (Skipping it here
                        # would leave an always-ready pipe in the wait set: a busy loop forever.)
                        raise self._crash(r) from None
                    del pending[obj]
                    if replies[r]["status"] != "ok" and first_error_at is None:
                        first_error_at = time.monotonic()
        for stream in self.records:
            stream.drain()
        if pending and first_error_at is None:
            raise self._hang(timeout, sorted(pending.values()))
        ops, streamed = zip(*[stream.ops(r) for r, stream in enumerate(self.records)])
        errors = {r: rep for r, rep in replies.items() if rep["status"] != "ok"}
        retire = any(rep["retire"] for rep in replies.values())   # a rank asks for a fresh world
        if errors:
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
            if dead and all(_is_gloo_fallout(rep) for rep in errors.values()):
                raise self._crash(dead[0])  # the others' errors are only its echo
            error = _rank_error(errors, self.world_size)
            # Every rank returned and their ops pair up: nothing is left in flight, so the
            # world is reusable (a stub fails every example; rebuilding each time is slow).
            error.world_reusable = (not pending and not isinstance(error, TraceTampered) and not retire
                                    and _ops_balanced(ops))
            if not error.world_reusable:
                self.kill()
            raise error
        try:
            self._check_record(ops, streamed, replies, policy)
        except BaseException:
            self.kill()
            raise
        trace = Trace([[_comm_op(op) for op in rank_ops] for rank_ops in ops],
                      [[PhaseSpan(**span) for span in stream.phases()] for stream in self.records])
        if retire:
            self.close()   # ``run`` builds a fresh world for the next call
        return RunResult([replies[r]["value"] for r in range(self.world_size)], trace)

    def _check_record(self, ops: list, streamed: list, replies: dict, policy: Policy):
        """The test process's own checks of what the ranks streamed: code in a rank that clears its policy
        or edits its tracer's lists after the fact changes nothing here.  The rank's op-count check read
        its own lists, so those must match the stream too (the digest)."""
        for r, rank_ops in enumerate(ops):
            if len(rank_ops) != replies[r]["ops_traced"]:
                raise TraceTampered(f"rank {r} streamed {len(rank_ops)} op records but its tracer holds "
                                    f"{replies[r]['ops_traced']}: something wrote to, or edited, the harness's record")
            if ops_digest(streamed[r]) != replies[r]["ops_digest"]:
                raise TraceTampered(f"rank {r}'s tracer holds op records that differ from what it streamed: "
                                    "something edited the harness's record")
            for op in rank_ops:
                try:
                    policy.check(op["kind"], op["site"])
                except ForbiddenOp as e:
                    raise ForbiddenOp(f"rank {r}: {e}") from None

    def _reply(self, rank: int, data: bytes, token: bytes) -> dict:
        try:
            reply = wire.decode(data)
            if not isinstance(reply, dict) or set(reply) != _REPLY_FIELDS:
                raise wire.WireError(f"a reply with fields {sorted(reply) if isinstance(reply, dict) else reply!r}")
        except wire.WireError as e:
            self.kill()
            raise TraceTampered(f"rank {rank} sent a reply that the harness's rank loop did not write: {e}") from None
        if reply["token"] != token:
            self.kill()
            raise TraceTampered(f"rank {rank} sent a reply that the harness's rank loop did not write")
        if self.conns[rank].poll(0):
            self.kill()
            raise TraceTampered(f"rank {rank} sent more than one reply")
        return reply

    def _crash(self, rank: int) -> RankCrashed:
        self.procs[rank].join(1.0)  # its pipe can close a moment before it is reaped
        time.sleep(0.1)  # let the other ranks' stderr settle
        code = self.procs[rank].exitcode
        stderr = self._stderr(rank)
        self.kill()
        if rank in self.over_memory:
            used, limit = self.over_memory[rank]
            return RankCrashed(f"rank {rank} used {used / _GB:.2f} GB (limit {limit:g} GB): the harness ended it. "
                               "Something allocates without bound (a growing list of tensors, a loop that "
                               "never ends, a shape off by a large factor?)", rank, code, stderr)
        return RankCrashed(_diagnose.crash_message(rank, code, stderr), rank, code, stderr)

    def _hang(self, timeout: float, stuck: list) -> HangError:
        stacks = self._stacks()
        for stream in self.records:
            stream.drain()
        flights = [stream.events() for stream in self.records]
        self.kill()
        where = {r: _diagnose.blocking_line(stacks[r]) for r in range(self.world_size)}
        diagnosis = _diagnose.diagnose_hang(flights, stuck, where)
        return HangError(_diagnose.hang_message(timeout, stuck, where, flights, diagnosis),
                         where, diagnosis, timeout)


_REPLY_FIELDS = {"token", "status", "value", "error", "retire", "ops_traced", "ops_digest"}
_WAIT_FIELDS = ("wait_start", "wait_end", "blocking", "compute_between")   # all that a wait may add to a record
_OP_FIELDS = {f.name for f in dataclasses.fields(CommOp)}


class _RecordStream:
    """One rank's op records, streamed over a pipe as they are issued (``_tracer.Recorder.flight``).

    The test process builds each call's trace from this stream, so a rank cannot take back or edit
    a record once its op has run.
    """

    def __init__(self):
        self.reader, self.writer = _CTX.Pipe(duplex=False)
        self.buffer = bytearray()

    def started(self):
        self.writer.close()   # the rank holds the only writer now

    def close(self):
        self.reader.close()

    def drain(self):
        try:
            while self.reader.poll(0):
                chunk = os.read(self.reader.fileno(), 1 << 20)
                if not chunk:
                    break   # the rank is gone
                self.buffer += chunk
        except OSError:
            pass

    def clear(self):
        self.buffer.clear()

    def raw_events(self) -> list:
        events = []
        for line in bytes(self.buffer).split(b"\n"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("ev") == "call":
                events = []   # only the current call's events count
            elif isinstance(event, dict):
                events.append(event)
        return events

    def events(self) -> list:
        """The events in the form the hang diagnosis reads: issue events carry the op's fields."""
        return [{**ev.get("op", {}), "ev": "issue", "i": ev.get("i")} if ev.get("ev") == "issue" else ev
                for ev in self.raw_events()]

    def ops(self, rank: int) -> tuple[list[dict], list[dict]]:
        """(the ops as issued, with only wait times added later; each op's last streamed form, raw)."""
        ops: dict[int, dict] = {}
        last: dict[int, dict] = {}
        for ev in self.raw_events():
            if ev.get("ev") in ("issue", "wait", "done") and isinstance(ev.get("op"), dict):
                i = ev.get("i")
                if ev["ev"] == "issue":
                    ops[i] = _normalised_op(ev["op"], rank)
                elif i not in ops:
                    raise TraceTampered(f"rank {rank}'s record stream updates op {i} before issuing it")
                else:   # a wait can only add its times: what an op was is fixed when it is issued
                    ops[i].update({k: ev["op"].get(k) for k in _WAIT_FIELDS if k in ops[i] or k in ev["op"]})
                last[i] = ev["op"]
        if set(ops) != set(range(len(ops))):
            raise TraceTampered(f"rank {rank}'s record stream numbers its ops {sorted(map(str, ops))}, "
                                f"not 0..{len(ops) - 1}")
        return [ops[i] for i in range(len(ops))], [last[i] for i in range(len(ops))]

    def phases(self) -> list[dict]:
        spans = {ev.get("k"): ev.get("span") for ev in self.raw_events() if ev.get("ev") == "phase"}
        return [spans[k] for k in sorted(spans, key=lambda k: (not isinstance(k, int), str(k)))]


def _normalised_op(op: dict, rank: int) -> dict:
    """A streamed record, with JSON's lists turned back into the tuples a CommOp holds."""
    if op.get("rank") != rank or not isinstance(op.get("group"), list):
        raise TraceTampered(f"rank {rank} streamed a malformed op record {str(op)[:200]}")
    op = {k: v for k, v in op.items() if k in _OP_FIELDS}
    op["group"] = tuple(op["group"])
    op["shapes"] = [tuple(s) for s in op.get("shapes") or []]
    if op.get("splits") is not None:
        op["splits"] = tuple(tuple(s) for s in op["splits"])
    return op


def _comm_op(op: dict) -> CommOp:
    try:
        return CommOp(**op)
    except TypeError as e:
        raise TraceTampered(f"rank {op.get('rank')} streamed a malformed op record: {e}") from None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


_FN_KEYS: dict = {}   # rank function -> small int; holding the function keeps its key unique


def _code_keeping_its_file(code: types.CodeType):
    """cloudpickle 3 ships code by value under the file name ``<dynamic-code>``; keep the real one, so
    trace sites, tracebacks and hang reports name ``test_x.py:15`` under every cloudpickle version."""
    rebuild, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    return rebuild, tuple(code.co_filename if isinstance(a, str) and a == "<dynamic-code>" else a for a in args)


class _FunctionPickler(cloudpickle.Pickler):
    def __init__(self, *args, **kwargs):
        ours = {types.CodeType: _code_keeping_its_file}
        torch = sys.modules.get("torch")
        if torch is not None:   # cloudpickle takes any attribute named ``ops`` for the module torch.ops
            ours[type(torch.ops)] = _torch_ops_by_name
        self.dispatch_table = ChainMap(ours, cloudpickle.Pickler.dispatch_table)   # read by __init__ below
        super().__init__(*args, **kwargs)


def _dump_function(fn) -> bytes:
    buffer = io.BytesIO()
    _FunctionPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(fn)
    return buffer.getvalue()


def _torch_ops_by_name(_ops):
    return importlib.import_module, ("torch.ops",)


def _dumps(obj) -> bytes:
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return cloudpickle.dumps(obj)


def _rank_entry(*args):
    from harness._rank import rank_main
    rank_main(*args)


_GLOO_NOISE = ("Connection closed by peer", "Connection reset", "Timed out", "Gloo", "gloo")


def _is_gloo_fallout(reply: dict) -> bool:
    return reply["status"] == "error" and any(s in str(reply["error"][1]) for s in _GLOO_NOISE)


def _ops_balanced(ops_by_rank: list) -> bool:
    """Every group's members issued as many collectives, and every send met its recv."""
    collectives, sends, recvs = {}, {}, {}
    for rank, ops in enumerate(ops_by_rank):
        for op in ops:
            if op["kind"] == "send":
                sends[(rank, op["peer"])] = sends.get((rank, op["peer"]), 0) + 1
            elif op["kind"] == "recv":
                recvs[(op["peer"], rank)] = recvs.get((op["peer"], rank), 0) + 1
            else:
                collectives.setdefault(op["group"], {}).setdefault(rank, 0)
                collectives[op["group"]][rank] += 1
    for group, counts in collectives.items():
        if len(counts) != len(group) or len(set(counts.values())) > 1:
            return False
    return sends == recvs


def _rank_error(errors: dict, world_size: int) -> BaseException:
    """Pick the root cause: prefer a rank whose error did not come from gloo's fallout."""
    rank, reply = sorted(errors.items(), key=lambda it: (_is_gloo_fallout(it[1]), it[0]))[0]
    kind, (exc_type, message, frames) = reply["status"], reply["error"]
    if kind == "forbidden":
        return ForbiddenOp(f"rank {rank}: {message}")
    if kind == "tampered":
        return TraceTampered(f"rank {rank}: {message}")
    cls = NotImplementedYet if exc_type == "NotImplementedError" and raised_by_stub(frames) else RankError
    return cls(rank, exc_type, message, frames, world_size)


_WORLDS: dict[tuple, World] = {}


_DEFAULTS = {"forbid": (), "allow": None, "timeout": None, "stop_on_hang": False, "memory_gb": None}


@contextmanager
def defaults(forbid=(), allow=None, timeout=None, stop_on_hang=False, backend=None, memory_gb=None):
    """Set the policy and timeout that ``run`` uses when a call gives none (the problem's, from problems.yaml).

    ``stop_on_hang`` raises hangs as ``HangStopped`` (a BaseException), so hypothesis reports
    the first hang at once instead of shrinking it one timeout at a time.
    """
    saved = dict(_DEFAULTS)
    _DEFAULTS.update(forbid=tuple(forbid or ()), allow=allow, timeout=timeout, stop_on_hang=stop_on_hang,
                     backend=backend, memory_gb=memory_gb)
    try:
        yield
    finally:
        _DEFAULTS.update(saved)


def run(fn, world_size: int, *args, timeout: float | None = None, forbid=None, allow=None,
        backend: str | None = None, memory_gb: float | None = None, record_compute: bool = False,
        perturb: tuple | None = None, **kwargs) -> RunResult:
    """Call ``fn(*args, **kwargs)`` on every rank of a world of ``world_size`` ranks.

    Returns each rank's value and the harness's trace of every communication op.
    ``forbid`` / ``allow`` name op kinds (see ``harness.trace``); breaking them
    raises ``ForbiddenOp``.  ``record_compute`` fills each op's ``compute_between``; ``perturb=(rank, n)``
    makes that rank's n-th point-to-point send carry a perturbed copy (see ``Policy``).
    Raises ``RankError`` (``NotImplementedYet`` for a
    stub), ``RankCrashed`` (also when a rank's resident memory passes ``memory_gb``)
    or ``HangError``.
    """
    if not 1 <= world_size <= 64:
        raise ValueError(f"world_size must be between 1 and 64, got {world_size}")
    backend = pick_backend(world_size, backend or _DEFAULTS.get("backend") or "auto")
    key = (world_size, backend)
    world = _WORLDS.get(key)
    if world is None or not world.procs or not all(p.is_alive() for p in world.procs):
        if world is not None:
            world.kill()
        world = _WORLDS[key] = World(world_size, backend)
    _register_by_value(fn)
    policy = Policy(_DEFAULTS["forbid"] if forbid is None else forbid, _DEFAULTS["allow"] if allow is None else allow,
                    record_compute=record_compute, perturb=perturb)
    timeout = timeout or _DEFAULTS["timeout"] or DEFAULT_TIMEOUT
    memory_gb = memory_gb or _DEFAULTS["memory_gb"] or default_memory_limit_gb(world_size)
    try:
        result = world.call(fn, args, kwargs, policy, timeout, memory_gb)
        timeline.save_if_asked(result.trace)
        return result
    except BaseException as error:
        if not getattr(error, "world_reusable", False):
            _WORLDS.pop(key, None)
            world.kill()
        if isinstance(error, HangError):
            error.args = (f"{error.args[0]}\n  the call: {_describe_call(fn, args, kwargs)}",)
            if _DEFAULTS["stop_on_hang"]:
                raise HangStopped(error) from None
        raise


def _describe_call(fn, args, kwargs, limit: int = 400) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    text = f"{getattr(fn, '__name__', fn)}({', '.join(parts)})"
    return text if len(text) <= limit else text[:limit] + "...)"


def _register_by_value(fn):
    """Rank functions often live in test files that the ranks cannot import by name."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or module.__name__ in ("__main__",) or module.__name__.startswith(("harness.", "torch")):
        return
    try:
        cloudpickle.register_pickle_by_value(module)
    except (ValueError, TypeError):
        pass


def shutdown():
    """Stop every pooled world.  Runs at exit; safe to call any time."""
    for world in list(_WORLDS.values()):
        world.close()
    _WORLDS.clear()


def live_rank_pids() -> list[int]:
    return [p.pid for w in _WORLDS.values() for p in w.procs if p.is_alive()]


atexit.register(shutdown)
