"""``KillAt``: a test's injected fault -- a rank killed in the middle of its file writes.

A checkpoint must survive a rank that dies while saving.  A test shows it by asking for the death --
``harness.run(fn, n, probes=[folder, KillAt(rank=1, event=3)])`` with ``folder`` a ``SharedFolder`` --
and the harness makes it real: just before that rank's 3rd file event under the folder, the rank is
SIGKILLed, as the kernel's OOM killer or a lost node would.  A file event is what moves a checkpoint
forward on disk: an open for writing, a rename (by destination), a remove, a mkdir or rmdir, a link.

Where the world's file witness runs (seccomp user notification, ``files``), the events are counted by
the test process below Python -- ``dir_fd``, ``os.fdopen`` and ctypes calls included -- and the kill
comes from outside the rank, so the rank cannot see it coming.  Elsewhere the trigger runs inside the
rank, on Python's audit hooks (a wrapped ``torch.save`` too), which cannot be removed: a world that ran
a kill call is never reused.  Either way the test process, not the rank, decides that a death was the
injected one, and ``run`` then returns normally with ``RunResult.killed`` set instead of raising
``RankCrashed``.
"""
from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

from .base import Probe, RankPart

KILL_LINE = "harness: the test killed this rank at "   # the rank's last stderr line, before the signal
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove": "remove", "os.mkdir": "mkdir", "os.rmdir": "rmdir"}


class KillAt(Probe):
    """Kill rank ``rank`` just before its ``event``-th file event (from 1, counted from the start of the
    call) under ``under``: a folder inside the call's ``SharedFolder`` (default: that folder)."""

    name = "kill"

    def __init__(self, rank: int, event: int, under: str | None = None):
        for what, value, least in (("rank", rank, 0), ("event", event, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"KillAt.{what} must be an integer >= {least}, got {value!r}")
        self.rank, self.event = rank, event
        self.under = None if under is None else os.path.realpath(under)
        self.outside = False

    def rank_part(self, world):
        """Nothing travels to the ranks where the file witness counts outside them; else the audit hook."""
        if world.shared is None:
            raise ValueError("KillAt counts file events under the call's shared folder: give it a SharedFolder")
        self.outside = world.files.can_kill(self.rank)
        return None if self.outside else _ArmTheAuditHook(self.rank, self.event, self.under)

    def start(self, world):
        if self.outside:
            world.files.arm_kill(self.rank, self.event, self.under or world.shared)

    def recognise(self, world, rank: int) -> "Killed | None":
        """The injected kill, if rank ``rank``'s death was it (the rank it names, SIGKILL, and either the file
        witness's own record or the harness's last stderr line); None for any other death."""
        if rank != self.rank:
            return None
        world.procs[rank].join(1.0)
        if self.outside:
            return world.files.killed(rank)
        return killed_from(rank, world.procs[rank].exitcode, world.stderr_of(rank))

    def __repr__(self):
        return f"KillAt(rank={self.rank}, event={self.event})"


class _ArmTheAuditHook(RankPart):
    name = "kill"

    def __init__(self, rank: int, event: int, under: str | None):
        self.rank, self.event, self.under = rank, event, under

    def enter(self, recorder):
        if recorder.rank == self.rank:
            arm(self.event, self.under or recorder.shared_dir)


@dataclass(frozen=True)
class Killed:
    """The injected kill that happened: which rank, the file event it died before (in words), and, when that
    event was an open for writing, the file's path from the counted folder's parent (else None)."""
    rank: int
    event: str
    written: str | None = None

    @classmethod
    def at(cls, rank: int, event: str) -> "Killed":
        """From the event in words, "its file event 3: open for writing ckpt/step_2/COMMIT"."""
        what = event.split(": ", 1)[-1]
        return cls(rank, event, what[len(_WRITE):] if what.startswith(_WRITE) else None)


_WRITE = "open for writing "   # how both counters (the file witness, the audit hook) name it, before its path


def killed_from(rank: int, exitcode: int | None, stderr: str) -> Killed | None:
    """The injected kill, if rank ``rank`` died of it (its exit code and its last stderr line say so)."""
    lines = [line for line in stderr.splitlines() if line.startswith(KILL_LINE)]
    if exitcode != -signal.SIGKILL or not lines:
        return None
    return Killed.at(rank, lines[-1][len(KILL_LINE):])


def arm(event_number: int, under: str) -> None:
    """In the rank: count file events under ``under`` and die at the ``event_number``-th."""
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
        if seen >= event_number:
            line = f"{KILL_LINE}its file event {seen}: {what} {os.path.relpath(full, os.path.dirname(root))}\n"
            os.write(2, line.encode(errors="replace"))
            os.kill(os.getpid(), signal.SIGKILL)

    def audit(name: str, args: tuple) -> None:
        if name == "open":
            path, mode, flags = args
            if (mode and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE_FLAGS:
                event(_WRITE.strip(), path)
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
