"""A judge's processes and folders end with it: SIGKILL to judge.py (what a grading timeout sends) leaves no test
process, forkserver or rank, and no temporary folder, within seconds."""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from tests.judge_helpers import ROOT

GONE_WITHIN = 5.0   # seconds after the judge's death


def _marked(mark: str) -> list[int]:
    """The pids of every process whose environment carries ``mark`` (the judge's descendants inherit it)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if mark.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def _wait_for(condition, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def test_sigkill_to_a_running_judge_leaves_no_process_and_no_folder(tmp_path):
    mark = f"KIT_LIFETIME_TEST={uuid.uuid4().hex}"
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="lt-", dir="/tmp"))   # short: the forkserver's socket lives there
    env = dict(os.environ, TMPDIR=str(scratch), NO_COLOR="1", KIT_STATE_DIR=str(tmp_path / "state"),
               KIT_LIFETIME_TEST=mark.split("=")[1])
    judge = subprocess.Popen([sys.executable, os.path.join(ROOT, "judge.py"), "113", "--solution"], cwd=ROOT, env=env,
                             stdout=open(tmp_path / "out", "w"), stderr=subprocess.STDOUT)
    try:
        # the judge, its test process, the forkserver and at least two ranks
        assert _wait_for(lambda: len(_marked(mark)) >= 5, 120), \
            f"the judge did not start its ranks: {(tmp_path / 'out').read_text()[-2000:]}"
        os.kill(judge.pid, signal.SIGKILL)
        judge.wait()
        gone = _wait_for(lambda: not _marked(mark), GONE_WITHIN)
        left = _marked(mark)
        assert gone, f"{len(left)} processes outlived their judge by {GONE_WITHIN:g} s: {left}"
        assert _wait_for(lambda: not os.listdir(scratch), 1.0), f"left behind in TMPDIR: {os.listdir(scratch)}"
    finally:
        for pid in _marked(mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(scratch, ignore_errors=True)
