"""``WarmTests``: judge_once's runner for --watch, one warm test process (kit.server) reused run after run.

A drop-in for ``judging.run_pytest``: the same call, the same result.  The warm process gets its events
pipe and its lifeline once, at its start (see ``channel``); each run ends with one report on that pipe.
A run that times out, is stopped (``stop``: a newer save), or whose test process dies, costs that process:
the next run starts a fresh one.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading

from .channel import Events, Lifeline, scratch
from .config import ROOT
from .judging import Run, kill_group, wait_for_report

_LIFETIME = 7 * 24 * 3600   # the warm process's own deadline: a judge that watches for a week


class WarmTests:
    def __init__(self, env: dict):
        self.env = env
        self.proc = self.events = self.lifeline = self.tmp = None
        self.output: list[str] = []
        self.progress = None   # the current run's progress callback

    def _start(self):
        self.events, self.lifeline = Events(lambda event: self.progress and self.progress(event)), Lifeline()
        # its TMPDIR is a folder of ours, removed with the process: nothing it leaves behind outlives it
        self.tmp = scratch("w")
        args = self.events.args() + self.lifeline.args(_LIFETIME)
        self.proc = subprocess.Popen([sys.executable, "-m", "kit.server", json.dumps(args)], cwd=ROOT,
                                     env=dict(self.env, TMPDIR=self.tmp.name), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, pass_fds=(self.events.write_fd, self.lifeline.read_fd))
        self.events.started()
        self.lifeline.started()
        output = self.output = []
        threading.Thread(target=lambda: output.extend(self.proc.stdout), daemon=True).start()

    def __call__(self, cmd: list, env: dict, timeout: float, progress=None,
                 stop: threading.Event | None = None) -> Run:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        self.progress, start = progress, len(self.output)
        self.events.expect_report()
        try:
            self.proc.stdin.write(json.dumps(cmd[3:]) + "\n")   # cmd is [python, -m, pytest, ...]
            self.proc.stdin.flush()
            wait_for_report(self.events, timeout, stop)
        except BaseException:   # a timeout, a stop, Ctrl-C, a broken pipe: this process is not reused
            self.close()
            raise
        finally:
            self.progress = None
        return Run(self.proc.returncode if self.proc else -9, "".join(self.output[start:]), self.events.report)

    def close(self):
        if self.proc is not None:
            kill_group(self.proc)
            self.lifeline.cut()
            self.events.join()
            self.tmp.cleanup()
            self.proc = None

