"""grade: every submission found, every student a row whose status says what happened, the statement's column
order, and a Ctrl-C or SIGTERM that leaves a partial gradebook and no process (issue 30)."""
import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kit import catalogue, grade as grading
from kit.config import KitConfig
from kit.judging import InternalError, JudgeTimeout, UsageError
from tests.judge_helpers import ROOT, judge, processes_with  # noqa: F401  (fixture)

REFERENCE = open(os.path.join(ROOT, "solutions/113_ddp_buckets/ddp_buckets.py"), encoding="utf-8").read()
PROBLEM = catalogue.load()[113]


def _with(old: str, new: str) -> str:
    assert old in REFERENCE, old
    return REFERENCE.replace(old, new, 1)


HANGING = _with("    def finish_gradient_sync(self):\n",
                "    def finish_gradient_sync(self):\n        if dist.get_rank() == 0 and dist.get_world_size() > 1:\n"
                "            dist.barrier()\n")
CRASHING = _with("        self.module = module\n",
                 "        self.module = module\n        if dist.get_rank() == 1:\n            import os; os._exit(7)\n")
# a shape off by a huge factor: the allocation is refused at once, whatever the machine's load
MEMORY_HOG = _with("        self.module = module\n",
                   "        self.module = module\n        self._hog = torch.ones(2**48)\n")
IMPORT_CRASH = _with("import torch\n", "import torch\nraise RuntimeError('config.yaml not found')\n")
WRONG = _with("            flat /= world\n", "")
# synchronous all-reduce in the hook, plus a patch that hides the waits from the tracer
CHEATING = _with("dist.all_reduce(flat, async_op=True)", "_sync_all_reduce(flat)") + """

class _Done:
    def wait(self):
        pass


def _sync_all_reduce(flat):
    dist.all_reduce(flat)
    return _Done()


import harness.record.recorder as _t
_t.Recorder.waiting = lambda self, work: None
"""


def _class(folder, files: dict):
    """A submissions folder: {relative path: text}; a path ending in / is an empty folder."""
    for rel, text in files.items():
        path = folder / rel
        if rel.endswith("/"):
            path.mkdir(parents=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def test_every_submission_the_readme_allows_is_found_and_whatever_is_skipped_is_listed(tmp_path):
    """#30: a folder xia/solution.py and a file Wu.PY were missing from grades.csv, with no warning."""
    folder = _class(tmp_path / "subs", {
        "alice.py": "", "Wu.PY": "", "xia/solution.py": "", "yan/upload/ddp_buckets.py": "",
        "zoe/DDP_Buckets.py": "", "zoe/helpers.py": "", "dan/__pycache__/old.py": "", "dan/mine.py": "",
        "bob/a.py": "", "bob/b.py": "", "carl/": "", "notes.txt": "", "alice/ddp_buckets.py": ""})
    found, skipped = grading.find_submissions(str(folder), PROBLEM)
    assert [(s, os.path.relpath(p, folder)) for s, p in found] == [
        ("alice", "alice.py"), ("dan", "dan/mine.py"), ("Wu", "Wu.PY"), ("xia", "xia/solution.py"),
        ("yan", "yan/upload/ddp_buckets.py"), ("zoe", "zoe/DDP_Buckets.py")]
    assert {s["entry"]: s["why"] for s in skipped} == {
        "alice/": "a second submission of alice: alice.py is the one graded",
        "bob/": "a folder with 2 .py files, none named ddp_buckets.py: a.py, b.py",
        "carl/": "a folder with no .py file in it",
        "notes.txt": "not a .py file"}
    with pytest.raises(UsageError, match="is a file. To judge one file: python judge.py 113 --target"):
        grading.find_submissions(str(folder / "alice.py"), PROBLEM)


def _test(name, outcome="passed", kind=None, message=""):
    return {"name": name, "outcome": outcome, "kind": kind, "message": message, "score": 1.0 if outcome == "passed"
            else 0.0, "max_score": 1.0, "example": ""}


def test_a_students_status_tells_each_outcome_apart(monkeypatch):
    """#30: the status column read "ok" for all six students, a syntax error and an import crash included."""
    passed, failed = _test("test_a"), _test("test_b", "failed", "property", "wrong value")
    assert grading.student_status([passed, failed]) == ("scored", "")
    assert grading.student_status([_test("test_a", "failed", "load error", "syntax error in x.py:1")] * 2) == (
        "load error", "syntax error in x.py:1")
    for kind in ("memory", "crash", "hang", "tampered"):
        status, reason = grading.student_status([failed, _test("test_c", "failed", kind, f"a {kind}\nmore")])
        assert (status, reason) == (kind, f"test_c: a {kind}"), kind
    assert grading.student_status([failed, _test("test_d", "failed", "internal error", "no start")])[0] == "error"
    for raised, status in ((JudgeTimeout("slow"), "timeout"), (InternalError("broken"), "error")):
        def judge_once(*args, error=raised, **kwargs):
            raise error
        monkeypatch.setattr(grading, "judge_once", judge_once)
        row = grading.grade_one(PROBLEM, "alice", "alice.py", KitConfig(), 0, None, 7)
        assert row["status"] == status and row["error"], row
    assert set(grading.STATUSES) >= {"scored", "load error", "memory", "crash", "hang", "timeout", "interrupted"}


def test_the_gradebook_columns_follow_the_statement_and_unfinished_students_have_no_score(tmp_path):
    """#30: the test columns were alphabetical, not in the statement's (problems.yaml's points:) order."""
    names = sorted(PROBLEM.points)   # alphabetical: not the statement's order
    judged = {"student": "alice", "file": "alice.py", "status": "scored", "score": 3.0, "max_score": 16.0,
              "error": "", "tests": [_test(n) for n in names]}
    unfinished = {"student": "bob", "file": "bob.py", "status": "interrupted", "score": None, "max_score": 16.0,
                  "error": "interrupted", "tests": []}
    out = tmp_path / "grades.csv"
    grading.write_gradebook(grading.Gradebook([judged, unfinished], [{"entry": "x.txt", "why": "not a .py file"}]),
                            str(out), PROBLEM)
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["student", "score", "max_score", "status", *PROBLEM.points, "file"]
    assert rows[2][:4] == ["bob", "", "16", "interrupted"] and set(rows[2][4:-1]) == {""}
    assert json.loads((tmp_path / "grades.json").read_text())["skipped"] == [{"entry": "x.txt",
                                                                              "why": "not a .py file"}]


def test_a_failure_s_kind_tells_memory_and_a_machine_fault_from_a_crash():
    """#30: a memory hog was explained differently depending on the machine's load.  The harness's watchdog and an
    allocation the kernel refuses (a per-rank data limit) are both "memory"; ranks that never started (e.g.
    multiprocessing's intermittent "EOFError: Ran out of input" under load) are the kit's fault, not a crash."""
    from harness import errors
    from kit import failures
    cases = [
        (errors.RankCrashed("rank 1 used 3.02 GB (limit 3 GB): the harness ended it.", 1, -9, ""), "memory"),
        (errors.RankError(0, "RuntimeError", "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                          "can't allocate memory: you tried to allocate 1099511627776 bytes.", []), "memory"),
        (errors.RankError(0, "MemoryError", "", []), "memory"),
        (errors.RankCrashed("rank 0 failed to start: it exited with code 1", 0, 1, ""), "internal error"),
        (EOFError("Ran out of input"), "internal error"),
        (errors.RankCrashed("rank 1 was killed by signal 11 (SIGSEGV)", 1, -11, ""), "crash"),
        (errors.RankError(0, "ValueError", "bad shape", []), "RankError"),
    ]
    for exc, kind in cases:
        assert failures.explain(exc)[0] == kind, (exc, failures.explain(exc))


class _Bar:
    def __init__(self):
        self.total, self.completed = None, 0

    def update(self, task, total=None):
        self.total = total

    def advance(self, task, n=1):
        self.completed += n


def test_the_grade_bar_moves_with_each_finished_test():
    """#30: the grade progress bar froze for about 2.5 minutes: it moved once per student."""
    from kit.cli import GradeProgress
    bar = _Bar()
    tests = GradeProgress(bar, None, students=2)
    tests.event("alice", {"event": "collected", "count": 3})
    assert bar.total == 6
    for _ in range(2):
        tests.event("alice", {"event": "end"})
    assert bar.completed == 2
    tests.finished("alice")   # its third test never ended (a timeout): it still counts as done
    tests.finished("bob")     # bob never collected (stopped before): nothing to add
    assert bar.completed == 3


# four of 113's tests, listed alphabetically unlike the statement: 11 points
CLASS_TESTS = "test_timeline or test_bucket_contract or test_ddp_matches or test_one_async"


def test_a_class_of_every_kind_of_submission_grades_every_student_with_the_right_status(judge, tmp_path):
    """#30: a syntax error, an import crash, a deadlock, a memory hog, an odd file name and a nested folder."""
    subs = _class(tmp_path / "submissions", {
        "correct.py": REFERENCE, "Wu.PY": CHEATING, "xia/solution.py": WRONG, "broken.py": "def make_buckets(:\n",
        "import_crash.py": IMPORT_CRASH, "hanging.py": HANGING, "crashing.py": CRASHING, "hog.py": MEMORY_HOG,
        "notes.txt": "not code", "zed/": ""})
    out_csv = tmp_path / "grades.csv"
    out = judge("grade", 113, subs, "--out", out_csv, "--profile", "quick", "--jobs", 2, "-k", CLASS_TESTS,
                timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr
    grades = json.loads((tmp_path / "grades.json").read_text())
    results = {r["student"]: r for r in grades["results"]}
    status = {student: r["status"] for student, r in results.items()}
    assert status == {"correct": "scored", "Wu": "tampered", "xia": "scored", "broken": "load error",
                      "import_crash": "load error", "hanging": "hang", "crashing": "crash", "hog": "memory"}, grades
    full = results["correct"]["max_score"]
    assert full == 11 and results["correct"]["score"] == full and 0 < results["xia"]["score"] < full
    assert results["Wu"]["score"] <= full - 3 and "tracer was modified" in results["Wu"]["error"]
    assert "import_crash.py raised RuntimeError: config.yaml not found" in results["import_crash"]["error"]
    assert "import_crash.py:5" in results["import_crash"]["error"]
    assert "syntax error" in results["broken"]["error"] and "within 5 s" in results["hanging"]["error"]
    assert "can't allocate memory" in results["hog"]["error"] and "rank 1" in results["crashing"]["error"]
    assert {s["entry"] for s in grades["skipped"]} == {"notes.txt", "zed/"}
    assert "skipped notes.txt: not a .py file" in out.stdout and "skipped zed/:" in out.stdout
    header = out_csv.read_text().splitlines()[0].split(",")
    assert header[4:-1] == ["test_bucket_contract", "test_timeline", "test_ddp_matches_single_process_training",
                            "test_one_async_all_reduce_per_bucket_during_backward"]
    assert grades["summary"] and all(s["kind"] != "load error" for s in grades["summary"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_grade_writes_what_it_has_and_leaves_no_process(tmp_path, sig):
    """#30: after Ctrl-C, grade started two more students' judges and wrote nothing 138 s later; SIGTERM exited
    at once with rc 143, no message, and left the running judges orphaned."""
    subs = _class(tmp_path / "submissions", {"a.py": REFERENCE, "b.py": REFERENCE, "c.py": REFERENCE})
    out_csv = tmp_path / "grades.csv"
    marker = f"KIT_STATE_DIR={tmp_path}"
    env = dict(os.environ, KIT_STATE_DIR=str(tmp_path), NO_COLOR="1")
    proc = subprocess.Popen([sys.executable, "judge.py", "grade", "113", str(subs), "--out", str(out_csv),
                             "--profile", "quick", "--jobs", "1", "-k", "test_bucket_contract"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            # Ctrl-C as a terminal gives it, even when the suite runs in a background job
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen = ""
        while "graded a:" not in seen:
            line = proc.stdout.readline()
            assert line, seen
            seen += line
        time.sleep(1)   # b's judge is running, c's is waiting
        os.kill(proc.pid, sig)
        signalled = time.monotonic()
        rest, _ = proc.communicate(timeout=60)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, seen + rest
    assert took < 15, f"{took:.1f} s from the signal to the exit"
    assert "interrupted: wrote" in rest and "1 of 3 students judged and 2 marked interrupted" in rest, rest
    rows = {r[0]: r for r in csv.reader(out_csv.open())}
    assert rows["a"][1:4] == ["3", "3", "scored"] and rows["b"][3] == rows["c"][3] == "interrupted", rows
    assert json.loads((tmp_path / "grades.json").read_text())["interrupted"] is True
    time.sleep(0.5)
    assert not processes_with(marker), "a judge, a test process or a rank outlived grade"


def test_bad_grade_command_lines_are_one_line_usage_errors(judge, tmp_path):
    """#30: `grade 126 alice.py` said "submissions folder not found"; --jobs 0 was accepted; #24: --out into a
    folder that does not exist ended in a FileNotFoundError traceback."""
    subs = _class(tmp_path / "submissions", {"alice.py": REFERENCE})
    for args, words in [((subs / "alice.py", "--out", tmp_path / "g.csv"), "is a file. To judge one file"),
                        ((subs, "--out", tmp_path / "nowhere" / "g.csv"), "does not exist"),
                        ((subs, "--out", tmp_path / "g.csv", "--jobs", 0), "must be 1 or more"),
                        ((subs, "--out", tmp_path / "g.csv", "--timeout", 0), "must be more than 0")]:
        out = judge("grade", 113, *args)
        assert out.returncode == 4, (args, out.stdout, out.stderr)
        assert words in out.stderr.splitlines()[0] and "Traceback" not in out.stderr, out.stderr
