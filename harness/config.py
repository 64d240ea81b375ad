"""What ``harness.run`` uses when a call does not say: one ``RunDefaults``, set for a block with ``defaults``.

    with harness.defaults(forbid={"all_gather"}, timeout=10, on_trace=keep):
        harness.run(fn, 4, ...)        # forbids all_gather, times out after 10 s, hands its Trace to keep

The defaults live in a ``contextvars.ContextVar``: a block sets them for the code it runs (and
nested blocks inherit every field they do not give), and nothing else can change them.  The
engine reads no environment variable: whoever runs it (the judge app's configuration) passes its
overrides in here.
"""
from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable

DEFAULT_TIMEOUT = 5.0   # seconds a call may take when neither it nor its block says
_GB = 2**30


@dataclass(frozen=True)
class RunDefaults:
    """What a call uses for each argument it leaves out (None: the engine's own default).

    forbid, allow   op kinds the call may not / may only issue (see ``harness.trace``)
    timeout         seconds before the call is a hang (default ``DEFAULT_TIMEOUT``)
    stop_on_hang    raise hangs as ``HangStopped`` (a BaseException), so hypothesis reports the first
                    hang at once instead of shrinking it one timeout at a time
    backend         "gloo", "nccl" or "auto" (default "auto": NCCL when there is a GPU per rank)
    memory_gb       each rank's resident-memory limit (default ``default_memory_limit_gb``)
    on_trace        called with each successful call's ``Trace`` (to save or show it)
    audit_devices   the device audit (see ``devices``): tensors the rank function makes without naming
                    a device land on ``meta``, so code that ignores ``harness.device()`` fails on a CPU
    world_sizes     the world sizes calls may use (None: any); another raises ``WorldSkipped``, which
                    the kit's plugin turns into a skipped example (a GPU check on a machine with few GPUs)
    probes          probes every call of the block runs (``harness.probes``): its calls look alike to the ranks
    hidden          folders and files no rank may read (the kit's answers and tests, an instructor's hidden set)
    landlock        False: confine ranks as on a kernel without Landlock (tests of the fallback)
    """

    forbid: tuple = ()
    allow: tuple | None = None
    timeout: float | None = None
    stop_on_hang: bool = False
    backend: str | None = None
    memory_gb: float | None = None
    on_trace: Callable | None = None
    audit_devices: bool = False
    world_sizes: tuple | None = None
    probes: tuple = ()
    hidden: tuple = ()
    landlock: bool = True

    def __post_init__(self):
        object.__setattr__(self, "forbid", tuple(self.forbid or ()))
        object.__setattr__(self, "probes", tuple(self.probes or ()))
        object.__setattr__(self, "hidden", tuple(sorted(os.path.realpath(p) for p in self.hidden or ())))
        if self.allow is not None:
            object.__setattr__(self, "allow", tuple(self.allow))
        if self.world_sizes is not None:
            object.__setattr__(self, "world_sizes", tuple(self.world_sizes))


_CURRENT: ContextVar[RunDefaults] = ContextVar("harness_run_defaults", default=RunDefaults())


def current() -> RunDefaults:
    """The defaults in force here."""
    return _CURRENT.get()


@contextmanager
def defaults(**fields):
    """Set the defaults of ``harness.run`` for the block (``RunDefaults``'s fields; those not given
    keep the enclosing block's values).  Yields the ``RunDefaults`` in force inside."""
    token = _CURRENT.set(dataclasses.replace(_CURRENT.get(), **fields))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


def default_memory_limit_gb(world_size: int) -> float:
    """Each rank's resident-memory limit when none is given: the smaller of 8 GB and three quarters
    of this machine's memory shared by the world's ranks (a runaway submission usually runs away on
    every rank at once)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / _GB
    return min(8.0, 0.75 * physical / world_size)
