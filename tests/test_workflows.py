"""The learner's loop and the instructor's tools: hints, progress, reset, watch, grade, selfcheck."""
import json
import os
import shutil
import threading
import time

from harness import catalogue, workflows
from tests.judge_helpers import ROOT, judge  # noqa: F401  (fixture)

REFERENCE = os.path.join(ROOT, "solutions/113_ddp_buckets/ddp_buckets.py")


def test_hints_come_one_at_a_time_then_stop(judge):
    hints = catalogue.load()[113].hints
    for i, hint in enumerate(hints, 1):
        out = judge(113, "--hint")
        assert f"Hint {i}/{len(hints)}" in out.stdout and hint in out.stdout
    assert "No more hints" in judge(113, "--hint").stdout


def test_progress_is_recorded_and_shown(judge):
    judge(113, "--profile", "quick", "-k", "nothing_matches_this")  # a usage error records nothing
    judge(113, "--profile", "quick", "--seed", 1)
    listing = judge().stdout
    assert "failing (0/14)" in listing


def test_is_stub_recognises_stubs_only():
    stub = open(os.path.join(ROOT, "practice/113_ddp_buckets/ddp_buckets.py")).read()
    names = catalogue.load()[113].names
    assert workflows.is_stub(stub, names)
    assert not workflows.is_stub(open(REFERENCE).read(), names)


def test_the_pristine_stub_comes_from_git_history():
    problem = catalogue.load()[113]
    assert workflows.is_stub(workflows.pristine_stub(problem), problem.names)


class _ScratchProblem:
    """Problem 113's names and stub, but a practice file in a temp folder (tests run in parallel)."""

    def __init__(self, path):
        self.path, self.folder, self.file = str(path), "113_ddp_buckets", "ddp_buckets.py"
        self.names = catalogue.load()[113].names

    def practice_file(self):
        return self.path


def test_reset_restores_the_stub_and_keeps_a_backup(tmp_path, monkeypatch):
    monkeypatch.setattr(workflows, "STATE_DIR", str(tmp_path / "state"))
    problem = _ScratchProblem(tmp_path / "ddp_buckets.py")
    stub = _real_pristine(catalogue.load()[113])
    monkeypatch.setattr(workflows, "pristine_stub", lambda p: stub)
    (tmp_path / "ddp_buckets.py").write_text("# my work in progress\n")
    assert "Left your file" in workflows.reset(problem, ask=lambda q: "n")
    assert (tmp_path / "ddp_buckets.py").read_text() == "# my work in progress\n"
    assert "Restored the stub" in workflows.reset(problem, ask=lambda q: "y")
    assert (tmp_path / "ddp_buckets.py").read_text() == stub
    backup_dir = tmp_path / "state" / "backups" / "113_ddp_buckets"
    assert [p.read_text() for p in backup_dir.iterdir()] == ["# my work in progress\n"]
    assert "already the stub" in workflows.reset(problem, ask=lambda q: "y")


_real_pristine = workflows.pristine_stub


def test_watch_rejudges_after_each_save(tmp_path):
    watched = tmp_path / "mine.py"
    watched.write_text("v1")
    runs = []
    thread = threading.Thread(target=workflows.watch, args=(str(watched), lambda: runs.append(watched.read_text())),
                              kwargs={"poll": 0.05, "max_runs": 3}, daemon=True)
    thread.start()
    for text in ("v2", "v3 is longer"):
        deadline = time.monotonic() + 5
        while len(runs) < ("v2", "v3 is longer").index(text) + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.05)
        watched.write_text(text)
    thread.join(10)
    assert runs == ["v1", "v2", "v3 is longer"]


def test_watch_command_runs_a_fresh_judge_and_exits_cleanly_on_ctrl_c(tmp_path):
    import signal
    import subprocess
    import sys
    env = dict(os.environ, KIT_STATE_DIR=str(tmp_path), NO_COLOR="1")
    proc = subprocess.Popen([sys.executable, "judge.py", "113", "--watch", "--solution", "-k", "timeline"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        seen = ""
        while "score:" not in seen and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen += line
        assert "score: 2/2" in seen, seen
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "stopped watching" in rest


def _submission(folder, name, text):
    (folder / f"{name}.py").write_text(text)


def test_grade_a_class_with_correct_wrong_hanging_crashing_and_cheating_submissions(judge, tmp_path):
    reference = open(REFERENCE).read()
    subs = tmp_path / "submissions"
    subs.mkdir()
    _submission(subs, "correct", reference)
    _submission(subs, "wrong", reference.replace("            flat /= world\n", ""))
    _submission(subs, "hanging", reference.replace(
        "    def finish_gradient_sync(self):\n",
        "    def finish_gradient_sync(self):\n        if dist.get_rank() == 0 and dist.get_world_size() > 1:\n"
        "            dist.barrier()\n"))
    _submission(subs, "crashing", reference.replace(
        "        self.module = module\n",
        "        self.module = module\n        if dist.get_rank() == 1:\n            import os; os._exit(7)\n"))
    # synchronous all-reduce in the hook, plus a patch that hides the waits from the tracer
    _submission(subs, "cheating", reference.replace(
        "dist.all_reduce(flat, async_op=True)", "_sync_all_reduce(flat)") + """

class _Done:
    def wait(self):
        pass


def _sync_all_reduce(flat):
    dist.all_reduce(flat)
    return _Done()


import harness._tracer as _t
_t.Recorder.waiting = lambda self, work: None
""")
    out_csv = tmp_path / "grades.csv"
    out = judge("grade", 113, subs, "--out", out_csv, "--profile", "quick", "--jobs", 2, timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr
    results = {r["student"]: r for r in json.loads((tmp_path / "grades.json").read_text())["results"]}
    assert results["correct"]["score"] == 14
    assert 0 < results["wrong"]["score"] < 14
    for student in ("hanging", "crashing"):
        assert results[student]["status"] == "ok" and results[student]["score"] < 14
    kinds = {t["name"]: t["kind"] for t in results["hanging"]["tests"] if t["outcome"] != "passed"}
    assert "hang" in kinds.values(), kinds
    kinds = {t["name"]: t["kind"] for t in results["crashing"]["tests"] if t["outcome"] != "passed"}
    assert "crash" in kinds.values(), kinds
    # an honest synchronous version loses the overlap test's 3 points; cheating must not do better
    assert results["cheating"]["score"] <= 11
    assert any("tracer was modified" in t["message"] for t in results["cheating"]["tests"])
    header = out_csv.read_text().splitlines()[0]
    assert header.startswith("student,score,max_score,status,") and "test_timeline" in header
    assert json.loads((tmp_path / "grades.json").read_text())["summary"]
