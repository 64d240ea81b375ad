"""The learner's loop and the instructor's tools: hints, progress, reset, watch, grade, selfcheck."""
import json
import os
import shutil
import threading
import time

from kit import catalogue, stubs
from kit.config import KitConfig
from kit.selfcheck import selfcheck_problem
from kit.watch import watch
from tests.judge_helpers import (CAP_OF_ONE_BYTE, ROOT, ProblemWithPracticeFile, hidden_tests, judge,  # noqa: F401
                                 processes_with)

REFERENCE = os.path.join(ROOT, "solutions/113_ddp_buckets/ddp_buckets.py")


def test_hints_come_one_at_a_time_then_stop(judge):
    hints = catalogue.load()[113].hints
    for i, hint in enumerate(hints, 1):
        out = judge(113, "--hint")
        assert f"Hint {i}/{len(hints)}" in out.stdout and hint in out.stdout
    assert "No more hints" in judge(113, "--hint").stdout


def _full_marks(number: int) -> float:
    """The points of every public test of a problem (its test functions, read with ast)."""
    import ast
    problem = catalogue.load()[number]
    names = [node.name for f in os.listdir(problem.tests_dir()) if f.startswith("test_") and f.endswith(".py")
             for node in ast.parse(open(os.path.join(problem.tests_dir(), f)).read()).body
             if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    return sum(problem.points_for(n) for n in names)


def test_progress_is_recorded_and_shown_and_watch_records_the_whole_score(judge, tmp_path):
    """#6: --watch (judge.py --brief inside) stopped at the first failure and saved that partial score."""
    judge(113, "--profile", "quick", "-k", "nothing_matches_this")  # a usage error records nothing
    assert not (tmp_path / "state" / "progress.json").exists()
    out = judge(113, "--brief", "--profile", "quick", "--seed", 1)
    assert out.returncode == 1
    full = _full_marks(113)
    assert f"score: 0/{full:g} " in out.stdout
    saved = json.loads((tmp_path / "state" / "progress.json").read_text())["problems"]["113"]
    assert saved["max_score"] == full
    assert f"failing (0/{full:g})" in judge().stdout


def test_is_stub_recognises_stubs_only():
    stub = open(os.path.join(ROOT, "practice/113_ddp_buckets/ddp_buckets.py")).read()
    names = catalogue.load()[113].names
    assert stubs.is_stub(stub, names)
    assert not stubs.is_stub(open(REFERENCE).read(), names)


def test_every_committed_stub_is_recognised():
    """A class the stub gives whole (an exception, a dataclass, a NamedTuple) leaves it a stub (118's SimResult)."""
    for number, problem in catalogue.load().items():
        with open(problem.practice_file(), encoding="utf-8") as f:
            assert stubs.is_stub(f.read(), problem.names), f"problem {number}'s stub is not recognised as one"


def test_the_pristine_stub_comes_from_git_history():
    problem = catalogue.load()[113]
    assert stubs.is_stub(stubs.pristine_stub(problem), problem.names)


class _ScratchProblem:
    """Problem 113's names and stub, but a practice file in a temp folder (tests run in parallel)."""

    def __init__(self, path):
        self.path, self.folder, self.file, self.number = str(path), "113_ddp_buckets", "ddp_buckets.py", 113
        self.names = catalogue.load()[113].names

    def practice_file(self):
        return self.path


def test_reset_restores_the_stub_and_keeps_a_backup(tmp_path, monkeypatch):
    state_dir = str(tmp_path / "state")
    problem = _ScratchProblem(tmp_path / "ddp_buckets.py")
    stub = _real_pristine(catalogue.load()[113])
    monkeypatch.setattr(stubs, "pristine_stub", lambda p: stub)
    (tmp_path / "ddp_buckets.py").write_text("# my work in progress\n")
    assert "Left your file" in stubs.reset(problem, state_dir, ask=lambda q: "n")
    assert (tmp_path / "ddp_buckets.py").read_text() == "# my work in progress\n"
    assert "Restored the stub" in stubs.reset(problem, state_dir, ask=lambda q: "y")
    assert (tmp_path / "ddp_buckets.py").read_text() == stub
    backup_dir = tmp_path / "state" / "backups" / "113_ddp_buckets"
    assert [p.read_text() for p in backup_dir.iterdir()] == ["# my work in progress\n"]
    assert "already the stub" in stubs.reset(problem, state_dir, ask=lambda q: "y")


_real_pristine = stubs.pristine_stub


def test_reset_without_a_terminal_is_a_usage_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    """#2: `judge.py 113 --reset < /dev/null` died with a raw EOFError."""
    import io
    import judge as judge_cli
    mine = tmp_path / "ddp_buckets.py"
    mine.write_text("# my work in progress\n")
    real = catalogue.load()
    problems = {**real, 113: ProblemWithPracticeFile(real[113], mine)}
    monkeypatch.setattr(catalogue, "load", lambda: problems)
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr("sys.stdin", io.StringIO(""))   # what `< /dev/null` gives input()
    assert judge_cli.main(["113", "--reset"]) == 4
    err = capsys.readouterr().err
    assert "no answer to read" in err and "--reset --yes" in err and "Traceback" not in err
    assert mine.read_text() == "# my work in progress\n"
    assert judge_cli.main(["113", "--reset", "--yes"]) == 0
    assert stubs.is_stub(mine.read_text(), real[113].names)


def test_selfcheck_checks_the_committed_stub_not_the_learners_solved_file(tmp_path):
    """#1: after 113 was solved, selfcheck called the learner's file "the stub" and reported a SURPRISE."""
    solved = tmp_path / "ddp_buckets.py"
    shutil.copy(REFERENCE, solved)
    problem = ProblemWithPracticeFile(catalogue.load()[113], solved)
    hidden = hidden_tests(tmp_path, CAP_OF_ONE_BYTE)   # one small test keeps this fast
    rows = {r["target"]: r for r in selfcheck_problem(problem, KitConfig(profile="quick"), tests_root=hidden)}
    assert rows["reference"]["ok"], rows["reference"]
    assert rows["stub"]["ok"] and rows["stub"]["detail"] == "scores 0, 'not implemented yet'", rows["stub"]
    assert rows["stub"]["path"] == "practice/113_ddp_buckets/ddp_buckets.py (git)"
    assert solved.read_text() == open(REFERENCE).read()


def _judged(runs):
    """A judge for watch() that records the content of the copy it was given."""
    return lambda copy, stop: runs.append(open(copy).read())


def test_watch_rejudges_after_each_save(tmp_path):
    watched = tmp_path / "mine.py"
    watched.write_text("v1")
    runs = []
    thread = threading.Thread(target=watch, args=(str(watched), _judged(runs)),
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


def test_watch_waits_for_a_save_to_finish(tmp_path):
    """A save that truncates first and writes a moment later is judged once, whole, never as the empty file."""
    watched = tmp_path / "mine.py"
    watched.write_text("v1")
    runs = []
    thread = threading.Thread(target=watch, args=(str(watched), _judged(runs)),
                              kwargs={"poll": 0.02, "max_runs": 2, "settle": 1.0}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not runs and time.monotonic() < deadline:
        time.sleep(0.02)
    with open(watched, "w") as f:   # the editor's save: truncate, then write a little later
        f.flush()
        time.sleep(0.2)
        f.write("v2, written whole")
    thread.join(10)
    assert runs == ["v1", "v2, written whole"]


def test_watch_gives_up_a_judge_when_a_newer_save_arrives_and_judges_a_copy_of_each_save(tmp_path):
    """#30: a save made while --watch was judging was partly picked up mid-run ("score: 11/13", neither file's)."""
    watched = tmp_path / "mine.py"
    watched.write_text("v1")
    seen, stopped, superseded = [], [], []

    def judge(copy, stop):
        seen.append((os.path.basename(copy), open(copy).read()))
        if len(seen) == 1:
            watched.write_text("v2, saved while v1 was judged")   # the copy being judged must not change
            stopped.append(stop.wait(10))
            seen.append(("still v1", open(copy).read()))
    thread = threading.Thread(target=watch, args=(str(watched), judge),
                              kwargs={"poll": 0.02, "max_runs": 2, "superseded": lambda: superseded.append(1)},
                              daemon=True)
    thread.start()
    thread.join(20)
    assert seen == [("mine.py", "v1"), ("still v1", "v1"), ("mine.py", "v2, saved while v1 was judged")]
    assert stopped == [True] and superseded == [1]


def _read_until(proc, text: str, timeout: float = 300) -> str:
    seen, deadline = "", time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert text in seen, seen
    return seen


def test_watch_judges_every_save_as_saved_in_one_warm_test_process(tmp_path):
    """#14: --watch keeps its test process warm between saves, and nothing stale crosses from one judge to the
    next: a save that breaks make_buckets fails at once, and the fix passes again."""
    import signal
    import subprocess
    import sys
    mine = tmp_path / "ddp_buckets.py"
    shutil.copy(REFERENCE, mine)
    marker = f"KIT_STATE_DIR={tmp_path}"
    env = dict(os.environ, KIT_STATE_DIR=str(tmp_path), NO_COLOR="1")
    proc = subprocess.Popen([sys.executable, "judge.py", "113", "--watch", "--target", str(mine), "-k",
                             "test_bucket_contract"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True,
                            # Ctrl-C as a terminal gives it, even when the suite runs in a background job
                            # (started with `&`, it ignores SIGINT, and children inherit that)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _read_until(proc, "score: 3/3")
        warm = set(processes_with(marker)) - {proc.pid}
        good = mine.read_text()
        time.sleep(1.1)   # a new mtime, even on coarse file systems
        mine.write_text(good.replace("for i in reversed(range(len(sizes))):", "for i in range(len(sizes)):"))
        _read_until(proc, "score: 0/3")
        assert "returned [[0, 1], [2, 3]]" in _read_until(proc, "rerun just this case")
        time.sleep(1.1)
        mine.write_text(good)
        _read_until(proc, "score: 3/3")
        assert warm & set(processes_with(marker)), "each save started a new test process"
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "stopped watching" in rest
    time.sleep(0.5)
    assert not processes_with(marker), "a test process or rank outlived --watch"
