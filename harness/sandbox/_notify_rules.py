"""What a file-call ``Supervisor`` decides on (``Rules``) and what it records (``Event``)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ._notify_filter import MODES


@dataclass(frozen=True)
class Rules:
    """What a ``Supervisor`` decides (paths are made canonical once, here).

    mode              "events" (count only; Landlock enforces) or "enforce" (apply hidden and writable)
    hidden            paths a rank may not even read (mode "enforce")
    writable          roots under which a rank may write, create, rename and remove (mode "enforce")
    count_under       the folder whose write events are counted
    kill_at           (n, pid): SIGKILL pid (None: the caller) at the n-th counted event, before it runs
    kill_after_write  let the n-th event run, and kill at the next routed call instead
    """
    mode: str = "events"
    hidden: tuple = ()
    writable: tuple = ()
    count_under: str | None = None
    kill_at: tuple | None = None
    kill_after_write: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"Rules.mode must be one of {MODES}, got {self.mode!r}")
        if self.kill_at is not None and not _kill_at_ok(self.kill_at):
            raise ValueError(f"Rules.kill_at must be (n >= 1, None or the pid of another process), "
                             f"got {self.kill_at!r}")
        for name in ("hidden", "writable"):
            object.__setattr__(self, name, tuple(os.path.realpath(p) for p in getattr(self, name)))
        if self.count_under is not None:
            object.__setattr__(self, "count_under", os.path.realpath(self.count_under))


def _kill_at_ok(kill_at) -> bool:
    """(n >= 1, None or the pid of another process): never pid 0 or -1 (a whole process group), nor ours."""
    try:
        n, pid = kill_at
    except (TypeError, ValueError):
        return False

    def whole(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    return whole(n) and n >= 1 and (pid is None or (whole(pid) and pid > 1 and pid != os.getpid()))


@dataclass(frozen=True)
class Event:
    """One file call: what it was ("open for writing", "rename to", "remove", ...), its canonical path
    (a rename's or link's destination) and the calling thread's id."""
    what: str
    path: str
    pid: int
