"""``harness.run``: call a function on N real torch.distributed ranks, from a pool of live worlds.

Ranks are forked from a forkserver that has torch preloaded, form one process group, and stay
alive between calls: a call costs a few milliseconds, not the seconds of a fresh ``mp.spawn``.
The pool keeps one ``World`` per (world size, backend); any failure retires that world, and the
next call builds a fresh one.  What a call leaves out comes from ``config.defaults``.
"""
from __future__ import annotations

import atexit
import os
import sys
from dataclasses import dataclass

import cloudpickle

from .config import DEFAULT_TIMEOUT, current, default_memory_limit_gb
from .devices import AUDIT_DEVICE, gpu_count
from .errors import BackendUnavailable, HangError, HangStopped, WorldSkipped
from .probes.kill import KillAt, Killed
from .record.policy import Policy
from .reuse import call_key, forget_kept, keep_result, kept_result
from .trace import Trace
from .world.setup import SandboxSpec
from .world.world import World
from .sandbox.status import summarise

_WORLDS: dict[tuple, World] = {}
_PROTECTIONS: dict = {}   # the protections of the worlds started so far (``protections``)


@dataclass
class RunResult:
    values: list          # each rank's return value, by rank
    trace: Trace
    flops: list | None = None   # each rank's floating-point operations, measured on the rank (``count_flops``)
    killed: Killed | None = None   # the injected kill (``kill=``), when it happened

    def __iter__(self):   # allows ``values, trace = harness.run(...)``
        return iter((self.values, self.trace))


def pick_backend(world_size: int, backend: str = "auto") -> str:
    """"auto": NCCL when there is one GPU per rank for this world, else gloo.  Asking for NCCL with
    fewer GPUs than ranks raises ``BackendUnavailable``, naming both counts."""
    if backend == "gloo":
        return backend
    gpus = gpu_count()
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise BackendUnavailable(f"NCCL needs one GPU per rank: a world of {world_size} ranks, and this machine "
                                 f"has {gpus} GPU{'' if gpus == 1 else 's'}")
    return backend


def run(fn, world_size: int, *args, timeout: float | None = None, forbid=None, allow=None,
        backend: str | None = None, memory_gb: float | None = None, record_compute: bool = False,
        perturb: tuple | None = None, reuse: bool = False, count_flops: bool = False,
        shared_dir: str | None = None, kill: KillAt | None = None, **kwargs) -> RunResult:
    """Call ``fn(*args, **kwargs)`` on every rank of a world of ``world_size`` ranks.

    Returns each rank's value and the harness's trace of every communication op.
    ``forbid`` / ``allow`` name op kinds (see ``harness.trace``); breaking them
    raises ``ForbiddenOp``.  ``record_compute`` fills each op's ``compute_between``; ``perturb=(rank, n)``
    makes that rank's n-th point-to-point send carry a perturbed copy (see ``Policy``).
    ``reuse=True`` returns an identical earlier call's result again, without running (see ``reuse``).
    ``count_flops=True`` fills ``RunResult.flops``: each rank's floating-point operations, counted by the
    harness around the rank function (torch's ``FlopCounterMode``), never reported by the code under test.
    ``shared_dir``: an existing folder every rank may read and write (the sandbox otherwise gives a rank
    only its private folder); files there outlive the call and the world, so one call can save and a
    later one, on another world size, load.  ``kill=KillAt(rank, event)``: that rank is SIGKILLed just
    before its event-th file event under ``shared_dir`` (see ``faults``); the call then returns normally,
    with ``RunResult.killed`` set, None for each rank that did not return, and an empty trace.
    Arguments left out (None) come from ``harness.defaults``.
    Raises ``RankError`` (``NotImplementedYet`` for a
    stub), ``RankCrashed`` (also when a rank's resident memory passes ``memory_gb``)
    or ``HangError``.
    """
    if not 1 <= world_size <= 64:
        raise ValueError(f"world_size must be between 1 and 64, got {world_size}")
    given = current()
    if given.world_sizes is not None and world_size not in given.world_sizes:
        raise WorldSkipped(f"a world of {world_size} ranks is left out here (only {sorted(given.world_sizes)})")
    backend = pick_backend(world_size, backend or given.backend or "auto")
    shared_dir, kill = _shared(shared_dir, kill)
    policy = Policy(given.forbid if forbid is None else forbid, given.allow if allow is None else allow,
                    record_compute=record_compute, perturb=perturb,
                    default_device=AUDIT_DEVICE if given.audit_devices else None, count_flops=count_flops, kill=kill)
    kept_as = call_key(fn, world_size, backend, args, kwargs, policy) if reuse and kill is None else None
    kept = kept_result(kept_as)
    if kept is not None:
        return _result(*kept, given)
    sandbox = SandboxSpec(given.hidden, given.landlock)
    key = (world_size, backend, shared_dir, sandbox)
    world = _WORLDS.get(key)
    if world is None or not world.procs or not all(p.is_alive() for p in world.procs):
        if world is not None:
            world.kill()
        if shared_dir is not None:   # one shared-folder world per size: tests often use a folder each
            for other in [k for k in _WORLDS if k[:2] == key[:2] and k[2] is not None]:
                _WORLDS.pop(other).close()
        world = _WORLDS[key] = World(world_size, backend, shared_dir, sandbox)
        _PROTECTIONS.update(summarise(world.protections, _PROTECTIONS))
    _register_by_value(fn)
    timeout = timeout or given.timeout or DEFAULT_TIMEOUT
    memory_gb = memory_gb or given.memory_gb or default_memory_limit_gb(world_size)
    try:
        values, trace, flops, killed = world.call(fn, args, kwargs, policy, timeout, memory_gb)
    except BaseException as error:
        if not getattr(error, "world_reusable", False):
            _WORLDS.pop(key, None)
            world.kill()
        if isinstance(error, HangError):
            error.args = (f"{error.args[0]}\n  the call: {_describe_call(fn, args, kwargs)}",)
            if given.stop_on_hang:
                raise HangStopped(error) from None
        raise
    finally:
        if kill is not None:   # its rank carries an armed trigger, or is dead: never reuse the world
            _WORLDS.pop(key, None)
            world.kill()
    if killed is not None:
        return RunResult(values, trace, flops, killed)
    keep_result(kept_as, values, trace, flops)
    return _result(values, trace, flops, given)


def _shared(shared_dir: str | None, kill: KillAt | None) -> tuple:
    """The shared folder as one canonical path, and the kill with the folder it watches."""
    if shared_dir is not None:
        if not os.path.isdir(shared_dir):
            raise ValueError(f"shared_dir must be an existing folder (the sandbox grants it when the ranks "
                             f"start), got {shared_dir!r}")
        shared_dir = os.path.realpath(shared_dir)
    if kill is None:
        return shared_dir, None
    if not isinstance(kill, KillAt):
        raise TypeError(f"kill must be a harness.KillAt, got {kill!r}")
    under = kill.under or shared_dir
    if under is None:
        raise ValueError("kill=KillAt(...) counts file events under a folder: give shared_dir= or KillAt(under=)")
    return shared_dir, KillAt(kill.rank, kill.event, os.path.realpath(under))


def _result(values: list, trace: Trace, flops: list | None, given) -> RunResult:
    if given.on_trace is not None:
        given.on_trace(trace)
    return RunResult(values, trace, flops)


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
    """Stop every pooled world, and forget every kept result.  Runs at exit; safe to call any time."""
    for world in list(_WORLDS.values()):
        world.close()
    _WORLDS.clear()
    forget_kept()


def protections() -> dict:
    """What confined the ranks of the worlds this process started (plain data for reports): each measure's
    state as the ranks reported it before any code under test ran, the weakest where ranks differ, and
    ``sealed``: whether every measure was in force.  Empty before the first world."""
    return dict(_PROTECTIONS)


def live_rank_pids() -> list[int]:
    """The pids of every live rank of every pooled world."""
    return [p.pid for w in _WORLDS.values() for p in w.procs if p.is_alive()]


atexit.register(shutdown)
