"""Judge one target against one problem's tests: run pytest in a test process, score its report.

judge.py and its workflows (selfcheck, grade, watch) build on ``judge_once``.  The test process is
a subprocess (a fresh one by default; --watch reuses one warm process, see ``kit.warm``), so a crash
or hang in it can never take the judge down, and the learner's file is only ever loaded in its ranks.
"""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from .catalogue import Problem
from .channel import Events, Lifeline, scratch
from .config import ROOT, KitConfig


NOT_IMPLEMENTED = "not implemented"   # the kind of a failure that stopped at the stub's own NotImplementedError


class JudgeStopped(KeyboardInterrupt):
    """The test run was stopped on purpose (its ``stop`` event: grade interrupted, --watch saw a newer save)."""


class UsageError(Exception):
    """Bad input from the person at the keyboard (exit code 4)."""


class InternalError(Exception):
    """The kit itself failed (exit code 3)."""


class JudgeTimeout(InternalError):
    """The test run took longer than its time limit and was stopped."""


@dataclass
class TestResult:
    name: str
    outcome: str          # passed | failed | skipped
    points: float
    max_points: float
    duration: float
    kind: str | None = None
    message: str = ""
    example: str = ""          # the case that broke it (hypothesis's shrunk draw, or the one the property names)
    target: str | None = None
    hypothesis: str = ""       # hypothesis's own notes and advice (judge.py --verbose)
    location: list | None = None   # [file, line, function] of a stub's own NotImplementedError
    drawing: str | None = None     # text the test recorded with record_property("drawing", ...) (--show)
    cost: dict | None = None       # the cost figures its last example recorded (testkit.cost): case, figures
    file: str = ""                 # the test file it came from (which test set: public or added)

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"


@dataclass
class Verdict:
    problem: Problem
    target: str
    tests: list = field(default_factory=list)
    seed: int = 0
    profile: str = "default"
    backend: str = "gloo"
    elapsed: float = 0.0
    tests_dir: str = ""
    stderr: str = ""
    added_tests_dir: str = ""   # a test set judged on top of tests_dir (--add-tests)
    protections: dict = field(default_factory=dict)   # what confined the ranks, as the engine reported it

    @property
    def score(self) -> float:
        return sum(t.points for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_points for t in self.tests)

    @property
    def all_passed(self) -> bool:
        return bool(self.tests) and all(t.passed for t in self.tests)

    def failures(self) -> list:
        return [t for t in self.tests if not t.passed]


def pytest_command(config: KitConfig, tests_dirs: list, *, target: str | None = None,
                   targets: list | None = None, seed: int | None = None, select: str | None = None,
                   trace_dir: str | None = None) -> list:
    cmd = [sys.executable, "-m", "pytest", *tests_dirs, "-p", "kit.plugin",
           "--rootdir", ROOT, "-c", os.path.join(ROOT, "pyproject.toml"),
           "-q", "--no-header", "-rN", "--tb=no", "-p", "no:cacheprovider", *config.pytest_args()]
    if targets is not None:
        cmd += ["--kit-targets", json.dumps(targets)]
    elif target is not None:
        cmd += ["--target", target]
    if seed is not None:
        cmd += [f"--hypothesis-seed={seed}"]
    if select:
        cmd += ["-k", select]
    if trace_dir:
        cmd += ["--kit-trace-dir", trace_dir]
    return cmd


@dataclass
class Run:
    """What one test run gave the judge: its exit code, its output, and the report from the events pipe."""
    returncode: int | None
    stdout: str
    report: dict | None


def run_pytest(cmd: list, env: dict, timeout: float, progress=None, stop: threading.Event | None = None) -> Run:
    """Run in its own process group, so a timeout, Ctrl-C or ``stop`` takes every rank down with it.

    The verdict arrives on the events pipe (``channel``), last thing in the session; the process
    group is then ended at once, instead of waiting about 2 s for pytest, the forkserver and the
    ranks to tear torch down.  ``progress(event)`` receives the plugin's progress events (dicts:
    collected, start, example, end, phase) as they happen.  The lifeline ends the test process if
    this judge dies, and its deadline if the judge is stuck.
    """
    events, lifeline = Events(progress), Lifeline()
    cmd = cmd + events.args() + lifeline.args(timeout + _GRACE)
    with scratch("r") as tmp:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_tmpdir_inside(env, tmp), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                pass_fds=(events.write_fd, lifeline.read_fd))
        events.started()
        lifeline.started()
        reader = _thread(_read_output, proc.stdout, output := [])
        try:
            wait_for_report(events, timeout, stop)
        finally:   # also on Ctrl-C, a stop and a timeout
            kill_group(proc)
            lifeline.cut()
            reader.join(timeout=2)
            events.join()
    return Run(proc.returncode, "".join(output), events.report)


_GRACE = 5.0   # the test process's own deadline is the judge's, a little later: the judge says why first


def _tmpdir_inside(env: dict, folder: str) -> dict:
    """TMPDIR inside the judge's own folder, so what the test process leaves there once its group is ended
    (multiprocessing's pymp-* folders) goes with that folder; unless that path is too long for the forkserver's
    socket under it (pymp-*/listener-*: a Unix socket path has at most 107 bytes)."""
    return dict(env, TMPDIR=folder) if len(folder) <= 60 else env


def wait_for_report(events: Events, timeout: float, stop: threading.Event | None):
    """Until the report arrives (or the test process is gone); JudgeTimeout past ``timeout``, JudgeStopped
    once ``stop`` is set."""
    deadline = time.monotonic() + timeout
    while not events.arrived.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
        if stop is not None and stop.is_set():
            raise JudgeStopped("the test run was stopped")
        if time.monotonic() > deadline:
            raise JudgeTimeout(f"the test run took longer than {timeout:g} s and was stopped")


def _thread(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _read_output(stream, into: list):
    for line in stream:
        into.append(line)


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def env_for_tests() -> dict:
    """The environment of a test process: this one's, with the kit importable from anywhere."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def judge_once(problem: Problem, target: str, config: KitConfig, *, tests_root: str | None = None,
               add_tests: str | None = None, seed: int | None = None, select: str | None = None,
               targets: list | None = None, timeout: float = 1800, progress=None,
               trace_dir: str | None = None, runner=run_pytest) -> Verdict:
    """Run one problem's tests on ``target`` (or ``targets``) in a test process and score them.

    ``tests_root``: a test set laid out like practice/ instead of the public tests; ``add_tests``: one judged
    with them.  ``config``: profile, shrinking, backend, verbosity; ``progress``: a callback for live progress
    events; ``trace_dir``: where each test's last traced call is written (judge.py --show);
    ``runner``: how the pytest command runs (``run_pytest``: a fresh process; ``WarmTests``: a warm one).
    """
    tests_dir = _checked_tests_dir(problem, tests_root)
    added = _checked_tests_dir(problem, add_tests) if add_tests else ""
    seed = seed if seed is not None else int.from_bytes(os.urandom(3), "big")
    cmd = pytest_command(config, [tests_dir] + ([added] if added else []), target=target, targets=targets,
                         seed=seed, select=select, trace_dir=trace_dir)
    started = time.perf_counter()
    done = runner(cmd, env_for_tests(), timeout, progress)
    elapsed = time.perf_counter() - started
    data = done.report
    if data is None:
        raise InternalError(f"the test run for problem {problem.number} produced no report "
                            f"(exit code {done.returncode}):\n{_tail(done.stdout)}")
    done.returncode = data.get("exitstatus", done.returncode)   # the group was ended once the report was whole
    if done.returncode not in (0, 1, 5) and not data["tests"]:
        raise InternalError(f"pytest could not run the tests in {tests_dir} (exit code {done.returncode}):\n"
                            f"{_tail(done.stdout)}")
    if done.returncode == 2 and "error" in done.stdout.lower() and "collect" in done.stdout.lower():
        raise InternalError(f"the tests in {tests_dir} failed to import:\n{_tail(done.stdout)}")
    listed = _listed_tests(problem, tests_dir, tests_root) | (test_names_in(added) if added else set())
    _check_report_names(problem, listed, data["tests"], whole=not select)
    tests = []
    for t in data["tests"]:
        max_points = problem.points_for(t["name"])   # the catalogue's points, never the report's
        tests.append(TestResult(name=t["name"], outcome=t["outcome"], max_points=max_points,
                                points=max_points if t["outcome"] == "passed" else 0.0, duration=t["duration"],
                                kind=t.get("kind"), message=t.get("message") or "", example=t.get("example") or "",
                                target=t.get("target"), hypothesis=t.get("hypothesis") or "",
                                location=t.get("location"), drawing=t.get("drawing"), cost=t.get("cost"),
                                file=t.get("file") or ""))
    return Verdict(problem, target or "", tests, seed, config.profile, config.backend, elapsed, tests_dir, done.stdout,
                   added, protections=data.get("protections") or {})


def _listed_tests(problem: Problem, tests_dir: str, tests_root: str | None) -> set:
    """The tests a run must report: the catalogue's list for the kit's own tests, the folder's for a hidden set."""
    return set(problem.points) if tests_root is None else test_names_in(tests_dir)


def test_names_in(folder: str) -> set:
    """Every ``test_*`` function defined at the top of the folder's ``test_*.py`` files (read, not run)."""
    names = set()
    for file in sorted(os.listdir(folder)):
        if file.startswith("test_") and file.endswith(".py"):
            with open(os.path.join(folder, file), encoding="utf-8") as f:
                tree = ast.parse(f.read(), filename=file)
            names |= {n.name for n in tree.body
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")}
    return names


def _check_report_names(problem: Problem, listed: set, reported: list, whole: bool):
    """A report that names a test the list does not have, or (for a whole run) lacks one it has, is no score."""
    names = {t["name"].split("[")[0] for t in reported}
    unknown, missing = sorted(names - listed), sorted(listed - names) if whole else []
    if unknown or missing:
        raise InternalError(f"the report for problem {problem.number} does not match its list of tests"
                            + (f"; it names {', '.join(unknown)}, which the list does not have" if unknown else "")
                            + (f"; it lacks {', '.join(missing)}" if missing else ""))


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _checked_tests_dir(problem: Problem, tests_root: str | None) -> str:
    """The problem's folder of a test set: ``<number>_<slug>``, or just ``<number>`` in an instructor's set."""
    tests_dir = problem.tests_dir(tests_root)
    if tests_root and not os.path.isdir(tests_dir) and os.path.isdir(os.path.join(tests_root, str(problem.number))):
        tests_dir = os.path.join(tests_root, str(problem.number))
    if not os.path.isdir(tests_dir):
        raise UsageError(f"no tests for problem {problem.number}: {tests_dir} does not exist")
    if not any(f.startswith("test_") and f.endswith(".py") for f in os.listdir(tests_dir)):
        raise UsageError(f"no test_*.py files in {tests_dir}")
    return tests_dir
