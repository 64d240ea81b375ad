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
import io
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import types
from collections import ChainMap
from contextlib import contextmanager
from dataclasses import dataclass

import cloudpickle

from . import _diagnose, timeline
from ._boot import CONTEXT
from ._tracer import Policy
from .errors import ForbiddenOp, HangError, HangStopped, NotImplementedYet, RankCrashed, RankError, TraceTampered
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
        return value.values[rank]
    return tuple(own(a) for a in args), {k: own(v) for k, v in kwargs.items()}


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
        self.files = [{k: os.path.join(self.dir, f"rank{r}.{k}") for k in ("stderr", "stack", "flight")}
                      for r in range(world_size)]
        self.conns, self.procs = [], []
        self.sent_fns = set()
        self.over_memory: dict[int, tuple] = {}   # rank -> (bytes used, limit) when the watchdog ended it
        store = os.path.join(self.dir, "store")
        for r in range(world_size):
            parent, child = _CTX.Pipe()
            p = _RankProcess(target=_rank_entry, args=(r, world_size, backend, store, child, self.files[r]),
                             daemon=True, name=f"harness-rank{r}")
            p.start()
            child.close()
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

    def _flight(self, rank: int) -> list:
        try:
            with open(self.files[rank]["flight"]) as f:
                return [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return []

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
        for c, payload in zip(self.conns, payloads):
            c.send_bytes(payload)
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        first_error_at = None
        pending = {c: r for r, c in enumerate(self.conns)}
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        while pending:
            wait_until = deadline if first_error_at is None else min(deadline, first_error_at + 0.3)
            left = wait_until - time.monotonic()
            ready = mpc.wait(list(pending) + list(sentinels), max(0.0, min(left, _WATCH_INTERVAL)))
            if not ready:
                if left <= _WATCH_INTERVAL:
                    break
                self.watch_memory(memory_gb)
                continue
            for obj in ready:
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
                    if replies[r][0] != "ok" and first_error_at is None:
                        first_error_at = time.monotonic()
        if pending and first_error_at is None:
            raise self._hang(timeout, sorted(pending.values()))
        errors = {r: rep for r, rep in replies.items() if rep[0] != "ok"}
        retire = any(len(rep) > 4 and rep[4] for rep in replies.values())   # a rank asks for a fresh world
        if errors:
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
            if dead and all(_is_gloo_fallout(rep) for rep in errors.values()):
                raise self._crash(dead[0])  # the others' errors are only its echo
            error = _rank_error(errors, self.world_size)
            # Every rank returned and their ops pair up: nothing is left in flight, so the
            # world is reusable (a stub fails every example; rebuilding each time is slow).
            error.world_reusable = (not pending and not isinstance(error, TraceTampered) and not retire
                                    and _ops_balanced([rep[2] for _, rep in sorted(replies.items())]))
            if not error.world_reusable:
                self.kill()
            raise error
        trace = Trace([[CommOp(**op) for op in replies[r][2]] for r in range(self.world_size)],
                      [[PhaseSpan(**p) for p in replies[r][3]] for r in range(self.world_size)])
        if retire:
            self.close()   # ``run`` builds a fresh world for the next call
        return RunResult([replies[r][1] for r in range(self.world_size)], trace)

    def _reply(self, rank: int, data: bytes, token: bytes):
        try:
            token_back, reply = _SafeUnpickler(io.BytesIO(data)).load()
        except pickle.UnpicklingError as e:
            self.kill()
            raise RankError(rank, "UnpicklingError", str(e), [], self.world_size) from None
        if token_back != token:
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
        flights = [self._flight(r) for r in range(self.world_size)]
        self.kill()
        where = {r: _diagnose.blocking_line(stacks[r]) for r in range(self.world_size)}
        diagnosis = _diagnose.diagnose_hang(flights, stuck, where)
        return HangError(_diagnose.hang_message(timeout, stuck, where, flights, diagnosis),
                         where, diagnosis, timeout)


class _SafeUnpickler(pickle.Unpickler):
    """Replies come from processes that ran learner code: unpickle plain data and tensors only.

    A pickle can name any callable; refusing the rest keeps learner code out of the test process.
    """

    _ALLOWED = {
        "builtins": {"set", "frozenset", "complex", "slice", "range", "bytearray", "list", "dict", "tuple",
                     "int", "float", "str", "bool", "bytes"},
        "collections": {"OrderedDict", "defaultdict", "deque"},
        "copyreg": {"_reconstructor"},
        "torch": {"Size", "device", "Tensor", "finfo", "iinfo"},
        "torch._utils": {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_parameter",
                         "_rebuild_parameter_with_state"},
        "torch._tensor": {"_rebuild_from_type_v2"},
        "torch.storage": {"_load_from_bytes", "UntypedStorage", "TypedStorage"},
        "torch.nn.parameter": {"Parameter"},
        "numpy": {"ndarray", "dtype"},
        "numpy.core.multiarray": {"_reconstruct", "scalar"},
        "numpy._core.multiarray": {"_reconstruct", "scalar"},
        "numpy.core.numeric": {"_frombuffer"},
        "numpy._core.numeric": {"_frombuffer"},
        "harness.trace": {"CommOp", "PhaseSpan", "Trace"},
        "harness.models": {"OptimizerSpec"},
    }

    def find_class(self, module, name):
        import torch
        allowed = name in self._ALLOWED.get(module, ()) or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        if allowed:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"its reply contains {module}.{name}, which the test process refuses to unpickle: rank functions "
            "must return plain data (numbers, strings, lists, dicts, tuples, tensors)")


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
    dispatch_table = ChainMap({types.CodeType: _code_keeping_its_file}, cloudpickle.Pickler.dispatch_table)


def _dump_function(fn) -> bytes:
    buffer = io.BytesIO()
    _FunctionPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(fn)
    return buffer.getvalue()


def _dumps(obj) -> bytes:
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return cloudpickle.dumps(obj)


def _rank_entry(*args):
    from harness._rank import rank_main
    rank_main(*args)


_GLOO_NOISE = ("Connection closed by peer", "Connection reset", "Timed out", "Gloo", "gloo")


def _is_gloo_fallout(reply) -> bool:
    return reply[0] == "error" and any(s in reply[1][1] for s in _GLOO_NOISE)


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
    rank, (kind, (exc_type, message, frames), *_rest) = sorted(
        errors.items(), key=lambda it: (_is_gloo_fallout(it[1]), it[0]))[0]
    if kind == "forbidden":
        return ForbiddenOp(f"rank {rank}: {message}")
    if kind == "tampered":
        return TraceTampered(f"rank {rank}: {message}")
    cls = NotImplementedYet if exc_type == "NotImplementedError" else RankError
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
        backend: str | None = None, memory_gb: float | None = None, **kwargs) -> RunResult:
    """Call ``fn(*args, **kwargs)`` on every rank of a world of ``world_size`` ranks.

    Returns each rank's value and the harness's trace of every communication op.
    ``forbid`` / ``allow`` name op kinds (see ``harness.trace``); breaking them
    raises ``ForbiddenOp``.  Raises ``RankError`` (``NotImplementedYet`` for a
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
    policy = Policy(_DEFAULTS["forbid"] if forbid is None else forbid, _DEFAULTS["allow"] if allow is None else allow)
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
