"""grade --ray (issue 29): a class graded through a real Ray cluster on loopback gets the gradebook a local grade
writes; a task whose worker dies on its retry too is "lost"; a SIGTERM stops it as it stops a local grade; without
Ray, or with no cluster at the address, --ray is a one-line usage error."""
import contextlib
import csv
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types

import pytest

from tests.judge_helpers import ROOT, judge, processes_with  # noqa: F401  (fixture)

REFERENCE = open(os.path.join(ROOT, "solutions/112_distributed_sampler/sampler.py"), encoding="utf-8").read()
# set_epoch changes nothing: fails test_epochs_change_the_order with a property's message, passes the rest
SEED_IGNORES_EPOCH = REFERENCE.replace("return self.seed + self.epoch", "return self.seed")
STUB = open(os.path.join(ROOT, "practice/112_distributed_sampler/sampler.py"), encoding="utf-8").read()
# two cheap tests: one rank each, and both fail differently for the stub and the wrong version
FEW_TESTS = ["-k", "epochs_change or bad_arguments", "--profile", "quick"]
# Ray binds every interface and advertises the machine's address unless it runs as a one-machine cluster
ON_LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray head on 127.0.0.1 for the module: its address, and the marker its workers and their judges hold in
    their environment.  Afterwards every process of it is ended, and none may be left: Ray's daemons are in the
    group ``ray start`` makes (its agents drop the marker), each worker is in a group of its own."""
    pytest.importorskip("ray")
    folder = tempfile.mkdtemp(prefix="ray-")   # short: Ray's Unix sockets live under it (107 bytes at most)
    marker = f"KIT_RAY_TEST={folder}"
    # 8 logical CPUs: two of 112's judges (4 ranks each) at once, as a local grade on CI's 2 cores runs two
    start = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--port", "0",
                              "--num-cpus", "8", "--include-dashboard", "false", "--disable-usage-stats",
                              "--temp-dir", folder], env=dict(os.environ, **ON_LOOPBACK, KIT_RAY_TEST=folder),
                             start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def left() -> set:
        return set(_in_group(start.pid)) | set(processes_with(marker))
    try:
        said, _ = start.communicate(timeout=120)
        assert start.returncode == 0, said
        with open(os.path.join(folder, "ray_current_cluster"), encoding="utf-8") as f:
            yield types.SimpleNamespace(address=f.read().strip(), marker=marker)
    finally:
        for pid in left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while left() and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(folder, ignore_errors=True)
        assert not left(), "a process of the test's Ray cluster outlived it"


def _in_group(group: int) -> list[int]:
    """The live processes of process group ``group``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                state, _, pgrp = f.read().rpartition(")")[2].split()[:3]
        except OSError:
            continue
        if int(pgrp) == group and state != "Z":
            found.append(int(pid))
    return found


def _gradebook(csv_path) -> tuple:
    """What a grade decided, without its timings and the run's own fields."""
    with open(csv_path, newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    with open(os.path.splitext(csv_path)[0] + ".json", encoding="utf-8") as f:
        book = json.load(f)
    for row in book["results"]:
        del row["elapsed"]
        for test in row["tests"]:
            del test["duration"]
    return table, book["results"], book["skipped"], book["summary"]


def test_a_class_graded_on_ray_gets_the_gradebook_a_local_grade_writes(ray_cluster, judge, tmp_path):
    folder = tmp_path / "class"
    (folder / "carol").mkdir(parents=True)   # a folder submission: its file's own name travels with the task
    (folder / "bob.py").write_text(STUB)       # its messages name the file: they must name the instructor's
    (folder / "carol" / "sampler.py").write_text(SEED_IGNORES_EPOCH)
    on_ray = judge("grade", 112, folder, "--out", tmp_path / "ray.csv", *FEW_TESTS, "--ray", ray_cluster.address,
                   env=ON_LOOPBACK)
    assert on_ray.returncode == 0, on_ray.stdout + on_ray.stderr
    here = judge("grade", 112, folder, "--out", tmp_path / "local.csv", *FEW_TESTS)
    assert here.returncode == 0, here.stdout + here.stderr

    assert _gradebook(tmp_path / "ray.csv") == _gradebook(tmp_path / "local.csv")
    _, results, _, _ = _gradebook(tmp_path / "ray.csv")
    assert [(r["student"], r["score"], r["status"]) for r in results] == [("bob", 0, "scored"), ("carol", 1, "scored")]
    assert str(folder / "bob.py") in results[0]["tests"][0]["message"]
    assert "graded carol: 1/2 (scored)" in on_ray.stdout


# A driver whose judge kills its Ray worker, as a node that goes down would: the task's one retry dies too.
DIES_ON_EVERY_TRY = """
import json, os, sys
sys.path.insert(0, {root!r})
from kit import catalogue
from kit.config import KitConfig
from kit.ray_grade import RayJudges

def dies(student, path, **_):
    with open({tries!r}, "a") as f:
        f.write(student + "\\n")
    os._exit(1)

judges = RayJudges({address!r}, catalogue.load()[112], KitConfig(profile="quick"))
try:
    rows = list(judges.rows(dies, [("alice", {file!r})]))
finally:
    judges.close()
with open({rows!r}, "w") as f:   # not stdout: the raylet's word on each death arrives there when it will
    json.dump(rows, f)
"""


def test_a_task_whose_worker_dies_on_its_retry_too_is_a_lost_row(ray_cluster, tmp_path):
    tries = tmp_path / "tries"
    driver = DIES_ON_EVERY_TRY.format(root=ROOT, tries=str(tries), address=ray_cluster.address,
                                      file=os.path.join(ROOT, "solutions/112_distributed_sampler/sampler.py"),
                                      rows=str(tmp_path / "rows.json"))
    run = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, **ON_LOOPBACK))
    assert run.returncode == 0, run.stdout + run.stderr
    [row] = json.loads((tmp_path / "rows.json").read_text())
    assert (row["status"], row["score"]) == ("lost", None)
    assert row["error"].startswith("WorkerCrashedError: ")
    assert tries.read_text() == "alice\nalice\n"


def test_a_sigterm_cancels_the_tasks_writes_the_gradebook_and_leaves_no_judge(ray_cluster, tmp_path):
    """Ray's core worker takes SIGTERM over in the driver: grade died at once and wrote nothing."""
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "alice.py").write_text("import time\ntime.sleep(3600)\n")
    grade = subprocess.Popen([sys.executable, "judge.py", "grade", "112", tmp_path / "class", "--out",
                              tmp_path / "grades.csv", "--ray", ray_cluster.address], cwd=ROOT,
                             env=dict(os.environ, **ON_LOOPBACK), start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _test_processes(ray_cluster.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        [judging] = _test_processes(ray_cluster.marker)   # alice's judge runs on a worker
        grade.send_signal(signal.SIGTERM)
        said, _ = grade.communicate(timeout=60)
    finally:
        if grade.poll() is None:
            os.killpg(grade.pid, signal.SIGKILL)
    assert grade.returncode == 2, said
    assert "0 of 1 students judged and 1 marked interrupted" in said, said
    assert json.loads((tmp_path / "grades.json").read_text())["results"][0]["status"] == "interrupted"
    deadline = time.monotonic() + 10
    while _in_group(judging) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _in_group(judging), "the test process or a rank of a cancelled task outlived it"


def _test_processes(marker: str) -> list[int]:
    """The judges' test processes (run_pytest's, each the leader of its group) on the cluster's workers."""
    found = []
    for pid in processes_with(marker):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"\0-m\0pytest\0" in f.read():
                found.append(pid)
    return found


# judge.py with Ray not importable, as in a base install
WITHOUT_RAY = [sys.executable, "-c", "import runpy, sys; sys.modules['ray'] = None; sys.argv[0] = 'judge.py'; "
                                     "runpy.run_path('judge.py', run_name='__main__')"]
JUDGE = [sys.executable, "judge.py"]
NEEDS_RAY = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")


@pytest.mark.parametrize("judge_py, options, said", [
    pytest.param(WITHOUT_RAY, ["--ray", "auto"], "--ray needs Ray: pip install -e '.[ray]'", id="no Ray"),
    pytest.param(JUDGE, ["--ray", "auto", "--jobs", "2"], "--jobs and --ray: ", id="--jobs"),
    pytest.param(JUDGE, ["--ray", "127.0.0.1:1"], "--ray 127.0.0.1:1: no Ray cluster answers there (",
                 id="no cluster there", marks=NEEDS_RAY)])
def test_ray_without_ray_or_a_cluster_is_a_one_line_usage_error(judge_py, options, said, tmp_path):
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "alice.py").write_text(REFERENCE)
    run = subprocess.run([*judge_py, "grade", "112", tmp_path / "class", "--out", tmp_path / "grades.csv", *options],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stdout + run.stderr
    assert run.stderr.startswith("error: " + said) and run.stderr.count("\n") == 1, run.stderr
    assert not (tmp_path / "grades.csv").exists()
