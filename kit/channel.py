"""The judge and its test process: a verdict channel no rank can write, and a lifeline that ends the test process.

* **Events** (test process -> judge): one pipe, JSON lines: progress events as the run goes, then
  ``{"event": "report", ...}``, the verdict.  Its writing end is passed to the test process alone
  (``pass_fds``); the forkserver the test process starts inherits no descriptor but its own, so no
  rank holds it, and there is no file whose path a rank could learn and write.
* **Lifeline** (judge -> test process): a pipe whose writing end only the judge holds.  The test
  process watches the reading end (``hold_to_judge``): end of file means the judge is gone, SIGKILL
  included, and the test process removes the judge's scratch folder and kills its own process group
  (itself, the forkserver, every rank).  The same watcher ends the run at its deadline, so the time
  limit holds even when the judge is stuck.
* **Scratch**: every temporary folder a judge makes (the test process's TMPDIR, selfcheck's stub copy,
  --show's traces) lives under one folder per judge process, which the lifeline's watcher removes if
  the judge dies before it can.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import tempfile
import threading
import time

_SCRATCH: list[str] = []   # this judge process's scratch root, made on first use
_HELD: list[int] = []      # the lifeline this test process already watches (a warm one runs many sessions)


def scratch_root() -> str:
    """This judge process's folder for every temporary folder it makes (removed at exit)."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.mkdtemp(prefix="kit-"))
        os.chmod(_SCRATCH[0], 0o711)   # ranks of their own uid reach their folders inside; nobody lists it
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return _SCRATCH[0]


def scratch(prefix: str) -> tempfile.TemporaryDirectory:
    """A temporary folder inside the scratch root (searchable by others, as the root is)."""
    folder = tempfile.TemporaryDirectory(prefix=prefix, dir=scratch_root())
    os.chmod(folder.name, 0o711)
    return folder


class Events:
    """The judge's end of the events pipe: progress callbacks as events arrive, and the report when it comes."""

    def __init__(self, progress=None):
        self.read_fd, self.write_fd = os.pipe()
        self.progress = progress
        self.report: dict | None = None
        self.arrived = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def args(self) -> list:
        return ["--kit-events-fd", str(self.write_fd)]

    def started(self):
        """The test process holds the writing end now: without our copy, its exit ends the stream."""
        os.close(self.write_fd)

    def expect_report(self):
        """The next report is a new run's (a warm test process serves one run after another)."""
        self.report = None
        self.arrived.clear()

    def _read(self):
        with os.fdopen(self.read_fd, encoding="utf-8", errors="replace") as stream:
            for line in stream:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("event") == "report":
                    self.report = event.get("report")
                    self.arrived.set()
                elif self.progress is not None:
                    try:
                        self.progress(event)
                    except Exception:   # a display problem must never stop the judge
                        pass
        self.arrived.set()   # the test process is gone: no report will come

    def join(self, timeout: float = 2.0):
        self._reader.join(timeout)


class Lifeline:
    """The judge's end of the lifeline: while it is open, the test process lives."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()

    def args(self, deadline_s: float) -> list:
        return ["--kit-lifeline-fd", str(self.read_fd), "--kit-scratch", scratch_root(),
                "--kit-deadline", f"{deadline_s:g}"]

    def started(self):
        os.close(self.read_fd)

    def cut(self):
        try:
            os.close(self.write_fd)
        except OSError:
            pass


# ---- the test process's side -------------------------------------------------------------------

def hold_to_judge(lifeline_fd: int, scratch_dir: str | None, deadline_s: float | None, before_exit=None):
    """In the test process: end this process group when the judge dies or the deadline passes.

    ``before_exit`` (stopping the harness's worlds) runs first, within a second; then the scratch
    folder goes, then SIGKILL to the whole process group.
    """
    if lifeline_fd in _HELD:
        return
    _HELD.append(lifeline_fd)
    deadline = time.monotonic() + deadline_s if deadline_s else None
    lifeline = select.poll()
    lifeline.register(lifeline_fd, select.POLLIN)

    def watch():
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            # poll, not select: the test process holds descriptors past select's FD_SETSIZE (1024)
            if not lifeline.poll(None if wait is None else wait * 1000):
                break                                   # the deadline
            try:
                if os.read(lifeline_fd, 64) == b"":
                    break                               # the judge is gone
            except OSError:
                break
        if before_exit is not None:
            done = threading.Thread(target=before_exit, daemon=True)
            done.start()
            done.join(1.0)
        if scratch_dir:
            shutil.rmtree(scratch_dir, ignore_errors=True)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="kit-lifeline", daemon=True).start()
