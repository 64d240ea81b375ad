"""Whole pytest sessions, run as subprocesses: xdist workers with worlds at once, nothing left behind; the bench."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.harness_helpers import ROOT

# Two tests that can only pass if two xdist workers run their worlds at the same time: each waits
# for the other's marker between calls.  One also crashes a rank on the way, so a replaced world
# is part of what must be cleaned up.  No kit plugin: the harness must clean up on its own.
SAMPLE = '''
import json, os, time
import pytest, torch, torch.distributed as dist
import harness

SHARED = os.environ["SAMPLE_SHARED"]

def scaled_sum(k):
    t = torch.tensor([float(dist.get_rank() + k)])
    dist.all_reduce(t)
    return t.item(), os.getpid()

def die():
    os._exit(7)

def _meet(me, other):
    open(os.path.join(SHARED, me), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(SHARED, other)):
        assert time.monotonic() < deadline, "the other worker never ran its world at the same time"
        time.sleep(0.02)

def _work(me, other, crash):
    harness.run(scaled_sum, 2, 0, timeout=60)
    if crash:
        with pytest.raises(harness.RankCrashed, match="exited with code 7"):
            harness.run(die, 2, timeout=10)
    _meet(me + ".ready", other + ".ready")
    pids = set()
    for k in range(30):
        values = harness.run(scaled_sum, 2, k, timeout=30).values
        assert [v for v, _ in values] == [2.0 * k + 1] * 2
        pids |= {p for _, p in values}
    _meet(me + ".done", other + ".done")
    with open(os.path.join(SHARED, me + ".json"), "w") as f:
        json.dump({"worker": os.environ.get("PYTEST_XDIST_WORKER"), "pids": sorted(pids)}, f)

def test_a():
    _work("a", "b", crash=True)

def test_b():
    _work("b", "a", crash=False)
'''

# Runs the session as a child subreaper: whatever the session leaves behind is re-parented here
# when its parent exits, so every leftover descendant can be found by walking ppid chains in /proc.
WRAPPER = textwrap.dedent('''
    import ctypes, json, os, subprocess, sys, time
    ctypes.CDLL("libc.so.6").prctl(36, 1)   # PR_SET_CHILD_SUBREAPER
    out = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=float(os.environ["SAMPLE_LIMIT"]))

    def descendants():
        parent = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    parent[int(pid)] = int(fields[1])
            except OSError:
                pass
        found = []
        for pid in parent:
            p = parent[pid]
            while p in parent and p != os.getpid():
                p = parent[p]
            if p == os.getpid():
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
                except OSError:
                    continue
                found.append((pid, cmd))
        return found

    deadline = time.monotonic() + float(os.environ["SAMPLE_GRACE"])
    while True:
        while True:   # reap re-parented children that have exited
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        left = descendants()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid, _ in left:
        os.kill(pid, 9)
    print(json.dumps({"rc": out.returncode, "stdout": out.stdout[-3000:], "stderr": out.stderr[-3000:],
                      "left": left}))
''')

GRACE_S = 5.0   # how long the session's processes may take to go after pytest exits


def _run_and_find_leftovers(folder, *cmd) -> dict:
    env = dict(os.environ, SAMPLE_SHARED=str(folder), SAMPLE_LIMIT="240", SAMPLE_GRACE=str(GRACE_S),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], cwd=folder, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def xdist_session(tmp_path_factory):
    folder = tmp_path_factory.mktemp("xdist")
    (folder / "test_sample.py").write_text(SAMPLE)
    report = _run_and_find_leftovers(
        folder, sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider",
        "--rootdir", str(folder), str(folder / "test_sample.py"))
    return folder, report


def test_two_xdist_workers_run_worlds_at_once(xdist_session):
    folder, report = xdist_session
    assert report["rc"] == 0 and "2 passed" in report["stdout"], report["stdout"] + report["stderr"]
    a, b = (json.loads((folder / f"{name}.json").read_text()) for name in "ab")
    assert {a["worker"], b["worker"]} == {"gw0", "gw1"}
    assert len(a["pids"]) == len(b["pids"]) == 2 and not set(a["pids"]) & set(b["pids"])


def test_no_rank_process_is_left_alive_after_the_session(xdist_session):
    _, report = xdist_session
    assert report["left"] == [], f"still alive {GRACE_S:g} s after the session ended: {report['left']}"


KILLED = """
import os, signal
import harness

def pid():
    return os.getpid()

harness.run(pid, 2, timeout=60)
harness.run(pid, 3, timeout=60)
os.kill(os.getpid(), signal.SIGKILL)   # no atexit, no cleanup: a CI timeout or a second Ctrl-C
"""


def test_no_rank_process_outlives_a_killed_caller(tmp_path):
    (tmp_path / "killed.py").write_text(KILLED)
    report = _run_and_find_leftovers(tmp_path, sys.executable, str(tmp_path / "killed.py"))
    assert report["rc"] == -9, report["stderr"]
    assert report["left"] == [], f"still alive {GRACE_S:g} s after the caller was killed: {report['left']}"


def test_bench_prints_its_summary_line():
    out = subprocess.run([sys.executable, "-m", "harness.bench", "--calls", "20", "--spawn-calls", "1",
                          "--spawn-sizes", "4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert re.fullmatch(r"overhead_ms_n2=-?\d+\.\d+ overhead_ms_n4=-?\d+\.\d+ speedup_vs_spawn_n4=\d+\.\d+",
                        lines[-1]), out.stdout
    assert any(line.startswith("cold first call") for line in lines)
