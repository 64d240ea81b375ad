"""Where a learner's wait goes: a cold ``judge.py N``, each property's examples, and --watch's save-to-score.

    python -m kit.speed --problem N [--runs 3] [--saves 5] [--profile default]

Prints figures, never asserts them (the machines are shared and noisy): the median of ``--runs``
cold judges of the reference, the phases of one (from the plugin's progress events), each
property's cost per example split into the time inside ``harness.run`` (the ranks), the rest of
the example (drawing the case, expected values, checks) and hypothesis's own work, and the median
time from a save to the score under ``--watch``.  Loaded as a pytest plugin (``-p kit.speed``) it
records that split.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import pytest

from .config import ROOT

# ---- as a pytest plugin: time inside harness.run, per example, per test ----------------------------

_TIMES: dict = {}


def pytest_addoption(parser):
    parser.addoption("--kit-speed-out", default=None, help="where kit.speed's plugin writes its figures")


def _timed(fn, figures: dict, field: str, count: str | None = None):
    """``fn``, adding the seconds each call takes to ``figures[field]`` (and 1 to ``figures[count]``)."""
    fn = getattr(fn, "_kit_speed_of", fn)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            figures[field] += time.perf_counter() - start
            if count:
                figures[count] += 1
    timed._kit_speed_of = fn
    return timed


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    import harness
    figures = _TIMES.setdefault(item.name, {"examples": 0, "in_examples": 0.0, "in_run": 0.0})
    harness.run = _timed(harness.run, figures, "in_run")
    hyp = getattr(getattr(item, "obj", None), "hypothesis", None)
    if getattr(hyp, "inner_test", None) is not None:
        hyp.inner_test = _timed(hyp.inner_test, figures, "in_examples", count="examples")


def pytest_runtest_logreport(report):
    if report.when == "call" and report.nodeid.split("::")[-1] in _TIMES:
        figures = _TIMES[report.nodeid.split("::")[-1]]
        figures["duration"] = report.duration


def pytest_sessionfinish(session):
    out = session.config.getoption("--kit-speed-out")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(_TIMES, f)


# ---- the measurements --------------------------------------------------------------------------

def _judge(problem: int, profile: str, extra=()) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, os.path.join(ROOT, "judge.py"), str(problem), "--solution",
                           "--profile", profile, *extra], capture_output=True, text=True, cwd=ROOT)
    return time.perf_counter() - start, done.stdout


def phases(problem: int, profile: str) -> list[tuple[str, float]]:
    """One cold judge, split by the plugin's progress events, plus each property's split (kit.speed as plugin)."""
    from . import catalogue
    from .config import KitConfig
    from .judging import judge_once, run_pytest
    marks, start = {}, time.perf_counter()

    def progress(event):
        now = time.perf_counter() - start
        kind = event.get("event")
        if kind == "phase":
            marks.setdefault("plugin configured", now)
        elif kind == "collected":
            marks.setdefault("tests collected", now)
        elif kind == "start":
            marks.setdefault("first test starts", now)
        elif kind == "end":
            marks["last test ends"] = now
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "speed.json")

        def runner(cmd, env, timeout, progress=None):
            return run_pytest(cmd + ["-p", "kit.speed", "--kit-speed-out", out], env, timeout, progress)
        entry = catalogue.load()[problem]
        verdict = judge_once(entry, entry.solution_file(), KitConfig(profile=profile), progress=progress,
                             runner=runner)
        marks["verdict"] = time.perf_counter() - start
        with open(out, encoding="utf-8") as f:
            split = json.load(f)
    return sorted(marks.items(), key=lambda kv: kv[1]), split, verdict


def watch_latency(problem: int, saves: int) -> list[float]:
    """Seconds from each save of a copy of the reference to the score under ``judge.py N --watch``."""
    from . import catalogue
    entry = catalogue.load()[problem]
    with tempfile.TemporaryDirectory() as tmp:
        mine = os.path.join(tmp, entry.file)
        shutil.copy(entry.solution_file(), mine)
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "judge.py"), str(problem), "--watch",
                                 "--target", mine], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=ROOT, start_new_session=True)
        latencies = []
        try:
            _until_score(proc)   # the first judge: a cold start, not a save
            for i in range(saves):
                time.sleep(1.0)
                with open(mine, "a", encoding="utf-8") as f:
                    f.write(f"\n# save {i}\n")
                saved = time.perf_counter()
                _until_score(proc)
                latencies.append(time.perf_counter() - saved)
        finally:
            os.killpg(proc.pid, 2)
            proc.wait(30)
    return latencies


def _until_score(proc):
    for line in proc.stdout:
        if line.startswith("score:"):
            return
    raise RuntimeError("--watch ended before it showed a score")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.speed", description=__doc__.split("\n")[0])
    parser.add_argument("--problem", type=int, required=True, help="e.g. the one whose speed you are working on")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--profile", default="default")
    args = parser.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    walls = [_judge(args.problem, args.profile)[0] for _ in range(args.runs)]
    print(f"cold `judge.py {args.problem} --solution --profile {args.profile}`: "
          f"{', '.join(f'{w:.2f}' for w in walls)} s; median {statistics.median(walls):.2f} s")
    marks, split, verdict = phases(args.problem, args.profile)
    print("\none cold judge, by phase (seconds since judge_once started):")
    last = 0.0
    for name, at in marks:
        print(f"  {name:<20} {at:6.2f}   (+{at - last:.2f})")
        last = at
    print("\nper property: examples, seconds, ms per example, of which in harness.run / rest of example / "
          "hypothesis")
    for t in verdict.tests:
        f = split.get(t.name, {})
        n, dur = f.get("examples", 0) or 1, f.get("duration", t.duration)
        run, body = f.get("in_run", 0.0), f.get("in_examples", 0.0)
        print(f"  {t.name:<54} {f.get('examples', 0):4d} {dur:6.2f}  {1000 * dur / n:7.1f}  "
              f"{1000 * run / n:7.1f} / {1000 * (body - run) / n:6.1f} / {1000 * (dur - body) / n:6.1f}")
    if args.saves:
        latencies = watch_latency(args.problem, args.saves)
        print(f"\n--watch, save to score: {', '.join(f'{x:.2f}' for x in latencies)} s; "
              f"median {statistics.median(latencies):.2f} s")
    print(f"load average now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
