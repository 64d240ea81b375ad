"""Faults a test injects on purpose: ``KillAt`` kills a rank in the middle of its file writes.

A checkpoint must survive a rank that dies while saving.  A test shows it by asking for the
death -- ``harness.run(fn, n, shared_dir=folder, kill=KillAt(rank=1, event=3))`` -- and the
harness makes it real: just before that rank's 3rd file event under the folder, the rank
SIGKILLs itself, as the kernel's OOM killer or a lost node would.  A file event is what moves a
checkpoint forward on disk:

* opening a file for writing (``open``, ``io.open``, ``os.open`` with a write flag; pathlib's
  ``write_*`` and ``torch.distributed.checkpoint``'s writer use these);
* ``torch.save`` to a path or an open file (its C++ writer opens files without Python);
* ``os.rename`` / ``os.replace`` (and so ``Path.rename``, ``shutil.move``), by destination;
* ``os.remove`` / ``os.unlink``, ``os.mkdir`` / ``os.makedirs``, ``os.rmdir``.

The trigger runs inside the rank, on Python's audit hooks, which cannot be removed: a world that
ran a kill call is never reused.  The test process, not the rank, decides that a death was the
injected one (the rank it named died of SIGKILL after writing the harness's line), and ``run``
then returns normally with ``RunResult.killed`` set instead of raising ``RankCrashed``.
"""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

KILL_LINE = "harness: the test killed this rank at "   # the rank's last stderr line, before the signal
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove": "remove", "os.mkdir": "mkdir", "os.rmdir": "rmdir"}


@dataclass(frozen=True)
class KillAt:
    """Kill rank ``rank`` just before its ``event``-th file event (from 1, counted from the start of
    the call) under ``under`` (default: the call's ``shared_dir``)."""
    rank: int
    event: int
    under: str | None = None

    def __post_init__(self):
        for name in ("rank", "event"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "rank" else 1):
                raise ValueError(f"KillAt.{name} must be an integer >= {0 if name == 'rank' else 1}, got {value!r}")


@dataclass(frozen=True)
class Killed:
    """The injected kill that happened: which rank, and the file event it died before."""
    rank: int
    event: str


def killed_from(rank: int, exitcode: int | None, stderr: str) -> Killed | None:
    """The injected kill, if rank ``rank`` died of it (its exit code and its last stderr line say so)."""
    lines = [line for line in stderr.splitlines() if line.startswith(KILL_LINE)]
    if exitcode != -signal.SIGKILL or not lines:
        return None
    return Killed(rank, lines[-1][len(KILL_LINE):])


def arm(kill: KillAt, under: str) -> None:
    """In the rank: count file events under ``under`` and die at the ``kill.event``-th."""
    root = os.path.realpath(under)
    seen = 0

    def event(what: str, path) -> None:
        nonlocal seen
        if isinstance(path, int) or path is None:
            return   # a file descriptor or a file object without a name: not a path under the folder
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return
        if full != root and not full.startswith(root + os.sep):
            return
        seen += 1
        if seen >= kill.event:
            line = f"{KILL_LINE}its file event {seen}: {what} {os.path.relpath(full, os.path.dirname(root))}\n"
            os.write(2, line.encode(errors="replace"))
            os.kill(os.getpid(), signal.SIGKILL)

    def audit(name: str, args: tuple) -> None:
        if name == "open":
            path, mode, flags = args
            if (mode and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE_FLAGS:
                event("open", path)
        elif name == "os.rename":
            event("rename to", args[1])
        elif name in _PATH_EVENTS:
            event(_PATH_EVENTS[name], args[0])

    sys.addaudithook(audit)
    _count_torch_saves(event)


def _count_torch_saves(event) -> None:
    import torch
    import torch.serialization

    real_save = torch.serialization.save

    def save(obj, f, *args, **kwargs):
        event("torch.save", f if isinstance(f, (str, bytes, os.PathLike)) else getattr(f, "name", None))
        return real_save(obj, f, *args, **kwargs)

    torch.save = torch.serialization.save = save
