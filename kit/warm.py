"""``WarmTests``: judge_once's runner for --watch, one warm test process (kit.server) reused run after run.

A drop-in for ``judging.run_pytest``: the same call, the same result.  A run that times out, is stopped
(``stop``: a newer save), or whose test process dies, costs that process: the next run starts a fresh one.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from .config import ROOT
from .judging import JudgeStopped, JudgeTimeout, kill_group, read_progress


class WarmTests:
    def __init__(self, env: dict):
        self.env = env
        self.proc = None
        self.output: list[str] = []
        self.progress = None   # the current run's progress callback

    def _start(self):
        read_fd, self.progress_fd = os.pipe()
        # its TMPDIR is a folder of ours, removed with the process: nothing it leaves behind outlives it
        self.tmp = tempfile.mkdtemp(prefix="kit-warm-")
        self.proc = subprocess.Popen([sys.executable, "-m", "kit.server"], cwd=ROOT,
                                     env=dict(self.env, TMPDIR=self.tmp),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, pass_fds=(self.progress_fd,))
        output = self.output = []
        threading.Thread(target=lambda: output.extend(self.proc.stdout), daemon=True).start()
        threading.Thread(target=read_progress, args=(read_fd, lambda event: self.progress and self.progress(event)),
                         daemon=True).start()

    def __call__(self, cmd: list, env: dict, timeout: float, report: str, progress=None,
                 stop: threading.Event | None = None) -> subprocess.CompletedProcess:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        args = cmd[3:]   # cmd is [python, -m, pytest, ...]
        if progress is not None:
            args = args + ["--kit-progress-fd", str(self.progress_fd)]
        self.progress, start = progress, len(self.output)
        deadline = time.monotonic() + timeout
        try:
            self.proc.stdin.write(json.dumps(args) + "\n")
            self.proc.stdin.flush()
            while not os.path.exists(report):
                if self.proc.poll() is not None:
                    break   # it died: judge_once reports the missing report with this output
                if time.monotonic() > deadline:
                    raise JudgeTimeout(f"the test run took longer than {timeout:g} s and was stopped")
                if stop is not None and stop.is_set():
                    raise JudgeStopped("the test run was stopped")
                time.sleep(0.02)
        except BaseException:   # a timeout, a stop, Ctrl-C, a broken pipe: this process is not reused
            self.close()
            raise
        finally:
            self.progress = None
        return subprocess.CompletedProcess(cmd, self.proc.returncode if self.proc else -9,
                                           "".join(self.output[start:]), "")

    def close(self):
        if self.proc is not None:
            kill_group(self.proc)
            os.close(self.progress_fd)
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.proc = None
