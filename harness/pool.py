"""``harness.run``: call a function on N real torch.distributed ranks, from a pool of live worlds.

Ranks are forked from a forkserver that has torch preloaded, form one process group, and stay
alive between calls: a call costs a few milliseconds, not the seconds of a fresh ``mp.spawn``.
The pool keeps one ``World`` per (world size, backend); any failure retires that world, and the
next call builds a fresh one.  What a call leaves out comes from ``config.defaults``.
"""
from __future__ import annotations

import atexit
import sys
from dataclasses import dataclass, field

import cloudpickle

from .config import DEFAULT_TIMEOUT, current, default_memory_limit_gb
from .devices import AUDIT_DEVICE, gpu_count
from .errors import BackendUnavailable, HangError, HangStopped, WorldSkipped
from .probes import KillAt, Killed, Probe, ResidentMemory
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
    probes: dict = field(default_factory=dict)   # each probe's result, by its name (see ``harness.probes``)
    killed: Killed | None = None   # the injected kill (``probes.KillAt``), when it happened

    @property
    def flops(self) -> list | None:
        """Each rank's floating-point operations (``probes.Flops``), or None without that probe."""
        return self.probes.get("flops")

    @property
    def memory(self) -> list:
        """Each rank's resident memory at the call's start, peak and end (``probes.ResidentMemory``)."""
        return self.probes.get("memory")

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
        backend: str | None = None, memory_gb: float | None = None, reuse: bool = False, probes=(),
        **kwargs) -> RunResult:
    """Call ``fn(*args, **kwargs)`` on every rank of a world of ``world_size`` ranks.

    Returns each rank's value, the harness's trace of every communication op, and each probe's result.
    ``forbid`` / ``allow`` name op kinds (see ``harness.trace``); breaking them raises ``ForbiddenOp``.
    ``probes``: measurements and faults of this call (``harness.probes``: Compute, Flops, Perturb,
    SharedFolder, KillAt), added to the block's (``harness.defaults(probes=...)``); every call also runs
    the witnesses no rank can reach (resident memory, and where the kernel allows, traffic and files).
    A ``KillAt`` that fires returns normally, with ``RunResult.killed`` set, None for each rank that did
    not return, and an empty trace.
    ``reuse=True`` returns an identical earlier call's result again, without running (see ``reuse``).
    Arguments left out (None) come from ``harness.defaults``.
    Raises ``RankError`` (``NotImplementedYet`` for a stub), ``RankCrashed`` (also when a rank's resident
    memory passes ``memory_gb``), ``HangError``, or ``TraceTampered`` when a witness disagrees with the trace.
    """
    if not 1 <= world_size <= 64:
        raise ValueError(f"world_size must be between 1 and 64, got {world_size}")
    given = current()
    if given.world_sizes is not None and world_size not in given.world_sizes:
        raise WorldSkipped(f"a world of {world_size} ranks is left out here (only {sorted(given.world_sizes)})")
    backend = pick_backend(world_size, backend or given.backend or "auto")
    probes = _probes(given.probes, probes)
    forbid, allow = given.forbid if forbid is None else forbid, given.allow if allow is None else allow
    device = AUDIT_DEVICE if given.audit_devices else None
    faulty = any(isinstance(p, KillAt) for p in probes)
    kept_as = call_key(fn, world_size, backend, args, kwargs, (forbid, allow, device, probes)) \
        if reuse and not faulty else None
    kept = kept_result(kept_as)
    if kept is not None:
        return _result(*kept, given)
    shared = next((p.world_key() for p in probes if p.world_key() is not None), None)
    memory_gb = memory_gb or given.memory_gb or default_memory_limit_gb(world_size)
    key = (world_size, backend, shared, SandboxSpec(given.hidden, given.landlock, memory_gb))
    world = _world(key)
    policy = Policy(forbid, allow, default_device=device,
                    rank_parts=[part for part in (p.rank_part(world) for p in probes) if part is not None])
    _register_by_value(fn)
    timeout = timeout or given.timeout or DEFAULT_TIMEOUT
    try:
        values, trace, results, killed = world.call(fn, args, kwargs, policy, timeout, memory_gb, probes)
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
        if faulty:   # its rank carries an armed trigger, or is dead: never reuse the world
            _WORLDS.pop(key, None)
            world.kill()
    if killed is not None:
        return RunResult(values, trace, results, killed)
    keep_result(kept_as, values, trace, results)
    return _result(values, trace, results, given)


def _probes(block: tuple, call) -> list:
    """The block's probes, then the call's, then the witnesses every call runs; one of each name."""
    chosen = list(block) + list(call)
    for probe in chosen:
        if not isinstance(probe, Probe):
            raise TypeError(f"probes take harness.probes objects (Compute(), KillAt(rank, event), ...), got {probe!r}")
    names = [p.name for p in chosen]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two probes of the same kind in one call: {', '.join(twice)}")
    return chosen + [ResidentMemory()]


def _world(key: tuple) -> World:
    """The live world for ``key`` (size, backend, shared folder, sandbox), started if there is none."""
    world = _WORLDS.get(key)
    if world is None or not world.procs or not all(p.is_alive() for p in world.procs):
        if world is not None:
            world.kill()
        if key[2] is not None:   # one shared-folder world per size: tests often use a folder each
            for other in [k for k in _WORLDS if k[:2] == key[:2] and k[2] is not None]:
                _WORLDS.pop(other).close()
        world = _WORLDS[key] = World(*key)
        _PROTECTIONS.update(summarise(world.protections, _PROTECTIONS))
    return world


def _result(values: list, trace: Trace, results: dict, given) -> RunResult:
    if given.on_trace is not None:
        given.on_trace(trace)
    return RunResult(values, trace, results)


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
    """Stop every pooled world, and forget every kept result and what confined the worlds (a new session:
    ``protections`` starts again).  Runs at exit; safe to call any time."""
    for world in list(_WORLDS.values()):
        world.close()
    _WORLDS.clear()
    _PROTECTIONS.clear()
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
