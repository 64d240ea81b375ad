"""Judge one target against one problem's tests: run pytest in a fresh process, score its report.

judge.py and its workflows (selfcheck, grade, watch) build on ``judge_once``.
The test process is always a fresh subprocess, so edits are picked up and a
crash or hang in it can never take the judge down.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from .catalogue import ROOT, Problem


class UsageError(Exception):
    """Bad input from the person at the keyboard (exit code 4)."""


class InternalError(Exception):
    """The kit itself failed (exit code 3)."""


@dataclass
class TestResult:
    name: str
    outcome: str          # passed | failed | skipped
    points: float
    max_points: float
    duration: float
    kind: str | None = None
    message: str = ""
    example: str = ""
    target: str | None = None

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
    elapsed: float = 0.0
    tests_dir: str = ""
    stderr: str = ""

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


def pytest_command(problem: Problem, tests_dir: str, report: str, *, target: str | None = None,
                   targets: list | None = None, seed: int | None = None, select: str | None = None,
                   maxfail: int | None = None) -> list:
    cmd = [sys.executable, "-m", "pytest", tests_dir, "-p", "harness.pytest_plugin",
           "--rootdir", ROOT, "-c", os.path.join(ROOT, "pyproject.toml"), "--kit-report", report,
           "-q", "--no-header", "-rN", "--tb=no", "-p", "no:cacheprovider"]
    if targets is not None:
        cmd += ["--kit-targets", json.dumps(targets)]
    elif target is not None:
        cmd += ["--target", target]
    if seed is not None:
        cmd += [f"--hypothesis-seed={seed}"]
    if select:
        cmd += ["-k", select]
    if maxfail:
        cmd += [f"--maxfail={maxfail}"]
    return cmd


def run_pytest(cmd: list, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run in its own process group, so a timeout or Ctrl-C takes every rank down with it."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        return subprocess.CompletedProcess(cmd, -9, out + f"\n[judge] the test run exceeded {timeout:g} s and was stopped", "")
    except KeyboardInterrupt:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def judge_once(problem: Problem, target: str, *, tests_root: str | None = None, profile: str = "default",
               seed: int | None = None, select: str | None = None, maxfail: int | None = None,
               targets: list | None = None, extra_env: dict | None = None, timeout: float = 1800,
               no_shrink: bool = False) -> Verdict:
    tests_dir = problem.tests_dir(tests_root)
    if not os.path.isdir(tests_dir):
        raise UsageError(f"no tests for problem {problem.number}: {tests_dir} does not exist")
    if not any(f.startswith("test_") and f.endswith(".py") for f in os.listdir(tests_dir)):
        raise UsageError(f"no test_*.py files in {tests_dir}")
    seed = seed if seed is not None else int.from_bytes(os.urandom(3), "big")
    env = dict(os.environ, KIT_PROFILE=profile, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if no_shrink:
        env["KIT_NO_SHRINK"] = "1"
    env.update(extra_env or {})
    with tempfile.TemporaryDirectory(prefix="kit-judge-") as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = pytest_command(problem, tests_dir, report, target=target, targets=targets, seed=seed,
                             select=select, maxfail=maxfail)
        started = time.perf_counter()
        done = run_pytest(cmd, env, timeout)
        elapsed = time.perf_counter() - started
        if not os.path.exists(report):
            raise InternalError(f"the test run for problem {problem.number} produced no report "
                                f"(exit code {done.returncode}):\n{_tail(done.stdout)}")
        with open(report, encoding="utf-8") as f:
            data = json.load(f)
    if done.returncode not in (0, 1, 5) and not data["tests"]:
        raise InternalError(f"pytest could not run the tests in {tests_dir} (exit code {done.returncode}):\n"
                            f"{_tail(done.stdout)}")
    if done.returncode == 2 and "error" in done.stdout.lower() and "collect" in done.stdout.lower():
        raise InternalError(f"the tests in {tests_dir} failed to import:\n{_tail(done.stdout)}")
    tests = []
    for t in data["tests"]:
        max_points = float(t["points"])
        tests.append(TestResult(name=t["name"], outcome=t["outcome"], max_points=max_points,
                                points=max_points if t["outcome"] == "passed" else 0.0, duration=t["duration"],
                                kind=t.get("kind"), message=t.get("message") or "", example=t.get("example") or "",
                                target=t.get("target")))
    return Verdict(problem, target or "", tests, seed, profile, elapsed, tests_dir, done.stdout)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
