"""pytest integration: the ``target`` fixture, the problem's policy, shared profiles, plain-words failures.

Loaded by the root conftest.py, and by judge.py with ``-p harness.pytest_plugin``
so that a hidden test folder outside the repository gets the same behaviour.

Choosing the code under test, in order of precedence:
    --target FILE          a student's file or a known-wrong version
    --solution             the reference in solutions/
    KIT_TARGET=FILE|solution
    (default)              the learner's stub in practice/

Plain ``pytest practice/`` (no -v, no --tb, no -r) ends with the kit's own summary: real
failures first in plain words with a rerun command, one line per problem that is not
implemented yet, and a table of every problem's status and score.  -v or --tb=... give
pytest's full output instead.
"""
from __future__ import annotations

import functools
import json
import os
import random
import sys
import time

import pytest
from hypothesis import HealthCheck, Phase, settings

from . import catalogue
from ._boot import start_forkserver
from .errors import (HangError, HangStopped, HarnessError, NotImplementedYet, RankCrashed, TargetError,
                     TraceTampered, _RankFailure)
from .properties import PropertyFailed, WrongType
from .target import Target

PROFILES = {"quick": 10, "default": 50, "thorough": 500}
# selfcheck only needs to know that a known-wrong version fails, not its smallest example
# No explain phase: its tracing slows every call of a failing multi-rank test many times over.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate]
if not os.environ.get("KIT_NO_SHRINK"):
    _PHASES.append(Phase.shrink)
# print_blob=False: @reproduce_failure advice is for test authors; the kit prints its own rerun command.
_COMMON = dict(deadline=None, derandomize=False, phases=_PHASES,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
for _name, _examples in PROFILES.items():
    settings.register_profile(_name, max_examples=_examples, print_blob=False, **_COMMON)
    settings.register_profile(_name + "-verbose", max_examples=_examples, print_blob=True, **_COMMON)
PROFILE = os.environ.get("KIT_PROFILE", "default")
settings.load_profile(PROFILE)

_STATE = {"seed": None, "progress": None, "trace_dir": None, "trace": None, "trace_seq": 0}


def pytest_addoption(parser):
    group = parser.getgroup("kit", "distributed-training practice kit")
    group.addoption("--target", default=None, help="judge this implementation file instead of practice/")
    group.addoption("--solution", action="store_true", help="judge the reference in solutions/")
    group.addoption("--kit-report", default=None, help="write a JSON report of every test (used by judge.py)")
    group.addoption("--kit-targets", default=None,
                    help="JSON list of {id, path}: run every test once per target (judge.py selfcheck)")
    group.addoption("--kit-progress-fd", type=int, default=None,
                    help="write progress events (JSON lines) to this inherited file descriptor (judge.py)")
    group.addoption("--kit-trace-dir", default=None,
                    help="write each test's last traced call as Chrome trace JSON into this folder (judge.py --show)")
    group.addoption("--kit-verbose", action="store_true", help="keep hypothesis's own advice (judge.py --verbose)")


def pytest_configure(config):
    # Start it before the tests import torch, so its own torch import overlaps with theirs.
    # An xdist controller runs no test: only its workers need ranks.
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        start_forkserver()
    if config.getoption("--kit-verbose") or config.option.verbose > 0:
        if not config.getoption("--hypothesis-profile", default=None):
            settings.load_profile(PROFILE + "-verbose")
    _configure_seed(config)
    fd = config.getoption("--kit-progress-fd")
    if fd is not None:
        _STATE["progress"] = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
        _progress(event="phase", text="starting the ranks")
    trace_dir = config.getoption("--kit-trace-dir")
    if trace_dir:
        from . import timeline
        _STATE["trace_dir"] = trace_dir
        timeline.set_sink(_keep_trace)


def _configure_seed(config):
    """One seed for the whole session, printed with the summary, so every failure has a rerun command."""
    from hypothesis import core
    seed = config.getoption("--hypothesis-seed", default=None)
    if seed is None:
        seed = (getattr(config, "workerinput", None) or {}).get("kit_seed")
        if seed is None:
            seed = random.SystemRandom().randrange(1, 1 << 24)
        core.global_force_seed = seed
    _STATE["seed"] = int(seed) if str(seed).isdigit() else seed


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker draws with the controller's seed, so one rerun command fits them all."""
    node.workerinput["kit_seed"] = _STATE["seed"]


def pytest_generate_tests(metafunc):
    targets = metafunc.config.getoption("--kit-targets")
    if targets and "target" in metafunc.fixturenames:
        chosen = json.loads(targets)
        metafunc.parametrize("target", [t["path"] for t in chosen], ids=[t["id"] for t in chosen],
                             indirect=True, scope="module")


_PROBLEMS = None


def _problems():
    global _PROBLEMS
    if _PROBLEMS is None:
        try:
            _PROBLEMS = catalogue.load()
        except catalogue.CatalogueError as e:
            raise pytest.UsageError(str(e)) from None
    return _PROBLEMS


def _problem_of(request):
    problem = catalogue.problem_for_path(str(request.node.path), _problems())
    if problem is None:
        pytest.fail(f"{request.node.path} is not inside a problem folder named <number>_<slug>", pytrace=False)
    return problem


def _target_path(config, problem, param=None) -> str:
    if param is not None:
        return os.path.abspath(param)
    chosen = config.getoption("--target") or os.environ.get("KIT_TARGET")
    if config.getoption("--solution") or chosen == "solution":
        return problem.solution_file()
    if chosen:
        return os.path.abspath(chosen)
    return problem.practice_file()


def _target_args(config) -> list | None:
    """The judge.py arguments that select this session's target again (None: no single target)."""
    if config.getoption("--kit-targets"):
        return None
    chosen = config.getoption("--target") or os.environ.get("KIT_TARGET")
    if config.getoption("--solution") or chosen == "solution":
        return ["--solution"]
    return ["--target", chosen] if chosen else []


@pytest.fixture(scope="module")
def problem(request):
    """The problems.yaml entry of the test file's folder."""
    return _problem_of(request)


@pytest.fixture(scope="module")
def target(request, problem):
    """The implementation under test, as a ``harness.Target`` (loaded only inside the ranks).

    A file that cannot be used fails every test with a ``TargetError`` ("load error").
    """
    path = _target_path(request.config, problem, getattr(request, "param", None))
    return Target(path, problem.names).validate()


@pytest.fixture(autouse=True, scope="module")
def _problem_policy(request):
    """Every ``harness.run`` in a problem's tests obeys that problem's ops policy and time limit."""
    problem = catalogue.problem_for_path(str(request.node.path), _problems())
    if problem is None:
        yield
        return
    # The problems' tests build CPU tensors, so they run on gloo; KIT_BACKEND=auto tries NCCL (untested).
    import torch
    torch.set_num_threads(1)  # expected values use tiny tensors: threads only add overhead on small machines
    from . import runner
    with runner.defaults(forbid=problem.forbidden_ops, allow=problem.allowed_ops, timeout=problem.time_limit,
                         stop_on_hang=True, backend=os.environ.get("KIT_BACKEND", "gloo")):
        yield


def pytest_sessionfinish(session):
    if "harness.runner" in sys.modules:
        sys.modules["harness.runner"].shutdown()
    path = session.config.getoption("--kit-report", default=None)
    if path and not hasattr(session.config, "workerinput"):
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"tests": _REPORTS, "seed": _STATE["seed"], "finished_at": time.time()}, f, indent=1)


# ---- progress (judge.py shows it on a TTY) -----------------------------------------------------

def _progress(**event):
    stream = _STATE["progress"]
    if stream is None:
        return
    try:
        stream.write(json.dumps(event) + "\n")
    except (OSError, ValueError):   # the judge went away: keep testing, stop reporting
        _STATE["progress"] = None


def pytest_collection_finish(session):
    _progress(event="collected", count=len(session.items))


def pytest_runtest_logstart(nodeid, location):
    _progress(event="start", test=nodeid.split("::")[-1])


# ---- each example: progress, the failing case, the trace of the failing call -------------------

def _keep_trace(trace):
    _STATE["trace"] = trace
    _STATE["trace_seq"] += 1


def _format_case(kwargs: dict, skip) -> str:
    drawn = {k: v for k, v in kwargs.items() if k not in skip}
    if list(drawn) == ["case"]:   # the problems' usual single ``case`` argument: its value says it all
        return repr(drawn["case"])
    return ", ".join(f"{k}={v!r}" for k, v in drawn.items())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    """Wrap hypothesis's inner test: count examples (progress) and remember the last failing one.

    After shrinking, hypothesis replays the smallest failing example last, so the last
    failing call is the case to show, and a trace it recorded is that case's timeline.
    """
    _STATE["trace"] = None
    item._kit_case, item._kit_case_traced = "", False
    hyp = getattr(getattr(item, "obj", None), "hypothesis", None)
    inner = getattr(hyp, "inner_test", None)
    if inner is None:
        seq = _STATE["trace_seq"]
        yield
        item._kit_case_traced = _STATE["trace_seq"] > seq
        return
    fixtures = set(getattr(item, "fixturenames", ()))
    test_settings = getattr(item.obj, "_hypothesis_internal_use_settings", settings.default)
    name = item.name
    counts = {"calls": 0, "failed": False}

    @functools.wraps(inner)
    def counted(*args, **kwargs):
        counts["calls"] += 1
        _progress(event="example", test=name, n=counts["calls"], of=test_settings.max_examples,
                  phase="shrinking" if counts["failed"] else "generating")
        case = _format_case(kwargs, fixtures)
        seq = _STATE["trace_seq"]
        try:
            return inner(*args, **kwargs)
        except BaseException:
            counts["failed"] = True
            item._kit_case = case
            item._kit_case_traced = _STATE["trace_seq"] > seq
            raise

    hyp.inner_test = counted
    try:
        yield
    finally:
        hyp.inner_test = inner


# ---- failures in plain words -------------------------------------------------------------------

def _first_exception(exc):
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _hypothesis_notes(exc) -> str:
    return "\n".join(getattr(exc, "__notes__", None) or []).strip()


def raised_by_stub(frames, target_path: str | None = None) -> bool:
    """A NotImplementedError is the learner's own ``raise NotImplementedError`` (an unfinished stub).

    True when the innermost user frame is in the learner's file and its line raises it; one
    raised deeper (inside torch, say: copying out of a meta tensor) is an ordinary error.
    """
    if not frames:
        return False
    file, _line, _func, source = frames[-1]
    if target_path is not None and os.path.basename(file) != os.path.basename(target_path):
        return False
    return "raise NotImplementedError" in (source or "")


def explain(exc, target_path: str | None = None) -> tuple[str, str]:
    """(kind, message) for a failure; kind is what judge.py shows in its table."""
    if isinstance(exc, NotImplementedYet):
        if raised_by_stub(exc.frames, target_path):
            return "not implemented", str(exc)
        return "error", _RankFailure._render(exc)
    if isinstance(exc, (HangError, HangStopped)):
        return "hang", str(exc)
    if isinstance(exc, RankCrashed):
        return "crash", str(exc)
    if isinstance(exc, WrongType):
        return "wrong type", str(exc)
    if isinstance(exc, PropertyFailed):
        return "property", str(exc)
    if isinstance(exc, TraceTampered):
        return "tampered", str(exc)
    if isinstance(exc, TargetError):
        return "load error", str(exc)
    if isinstance(exc, HarnessError):
        return type(exc).__name__, str(exc)
    if isinstance(exc, AssertionError):
        return "property", str(exc) or "assertion failed"
    return "error", f"{type(exc).__name__}: {exc}" + _where_in_tests(exc)


def _where_in_tests(exc) -> str:
    """For an error raised in the test process: the innermost test-file line, so it can be found."""
    import traceback
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" not in f.filename and "/harness/" not in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    rel = os.path.relpath(f.filename)
    return f"\n  at {f.filename if rel.startswith('..') else rel}:{f.lineno}: {(f.line or '').strip()}"


def _case_of(exc, item) -> str:
    case = getattr(exc, "case", None)
    if isinstance(case, dict):
        return ", ".join(f"{k}={v!r}" for k, v in case.items())
    if case:
        return str(case)
    return getattr(item, "_kit_case", "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" and not (report.failed and report.when == "setup"):
        return
    problem = catalogue.problem_for_path(str(item.path), _problems())
    points = problem.points_for(item.name) if problem else 1.0
    report.user_properties.append(("kit_points", points))
    report.user_properties.append(("kit_problem", problem.number if problem else None))
    target = getattr(item, "funcargs", {}).get("target")
    target_path = getattr(target, "path", None)
    exc = None
    if report.failed and call.excinfo is not None:
        exc = _first_exception(call.excinfo.value)
        kind, message = explain(exc, target_path)
        case = "" if kind in ("not implemented", "load error") else _case_of(exc, item)
        report.user_properties.append(("kit_kind", kind))
        report.user_properties.append(("kit_message", message))
        report.user_properties.append(("kit_example", case))
        report.user_properties.append(("kit_hypothesis", "\n\n".join(
            x for x in (_hypothesis_notes(call.excinfo.value), getattr(item, "hypothesis_report_information", ""))
            if x)))
        if kind == "not implemented" and exc.frames:
            file, line, func, _ = exc.frames[-1]
            report.user_properties.append(("kit_location", [file, line, func]))
        if isinstance(exc, (HarnessError, PropertyFailed, HangStopped, NotImplementedYet, TraceTampered)):
            text = f"[{kind}] {message}"
            if case:
                text += "\n\nfailing case: " + case
            report.longrepr = text
    if report.when == "call" and _STATE["trace_dir"] and _STATE["trace"] is not None:
        _save_trace(item, report, exc)


def _save_trace(item, report, exc):
    from . import timeline
    rank_side = isinstance(exc, (HarnessError, NotImplementedYet, HangStopped, TraceTampered))
    chrome = timeline.to_chrome(_STATE["trace"])
    chrome["otherData"] = {
        "test": item.name, "outcome": report.outcome,
        # True when the recorded call belongs to the failing example, and that call itself did not fail
        "failing_case_traced": bool(report.failed and item._kit_case_traced and not rank_side),
        "case": getattr(item, "_kit_case", ""),
    }
    with open(os.path.join(_STATE["trace_dir"], timeline.trace_file_name(item.name)), "w", encoding="utf-8") as f:
        json.dump(chrome, f)
    _STATE["trace"] = None


_REPORTS: list = []


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and (report.failed or report.skipped)):
        props = dict(report.user_properties)
        entry = {
            "nodeid": report.nodeid, "name": report.nodeid.split("::")[-1], "outcome": report.outcome,
            "duration": report.duration, "points": props.get("kit_points", 1.0),
            "problem": props.get("kit_problem"), "kind": props.get("kit_kind"),
            "message": props.get("kit_message") or (str(report.longrepr) if report.failed else ""),
            "example": props.get("kit_example", ""),
            "hypothesis": props.get("kit_hypothesis", ""),
            "location": props.get("kit_location"),
            "target": _target_id(report.nodeid),
        }
        _REPORTS.append(entry)
        _progress(event="end", test=entry["name"], outcome=entry["outcome"], kind=entry["kind"])


def _target_id(nodeid: str):
    """The id of the --kit-targets parameter in a node id like ``test_x[wrong:no_avg]``."""
    if "[" not in nodeid:
        return None
    return nodeid.rsplit("[", 1)[1].rstrip("]")


# ---- plain `pytest practice/`: the kit's summary -----------------------------------------------

def _kit_mode(config, terminal) -> bool:
    """Replace pytest's failure sections only when nothing is lost: default options, and every
    failure belongs to a problem's tests (so a broken harness test still shows its traceback)."""
    if config.getoption("--kit-report") or config.getoption("--kit-targets"):
        return False
    if config.option.verbose > 0 or config.option.tbstyle != "auto" or config.option.reportchars not in ("fE", "Ef"):
        return False
    failed = terminal.stats.get("failed", []) + terminal.stats.get("error", [])
    ours = {r["nodeid"] for r in _REPORTS if r["problem"] is not None}
    return bool(ours) and all(getattr(r, "nodeid", None) in ours for r in failed)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput") or not any(r["problem"] is not None for r in _REPORTS):
        return (yield)
    kit_mode = _kit_mode(config, terminalreporter)
    if kit_mode:
        # pytest's own sections would repeat every stub's NotImplementedError; the kit's summary replaces them
        config.option.tbstyle = "no"
        terminalreporter.reportchars = terminalreporter.reportchars.replace("f", "").replace("E", "")
    try:
        return (yield)
    finally:
        if config.option.verbose <= 0 or kit_mode:
            from . import report as kit_report
            lines = kit_report.pytest_summary(_REPORTS, _problems(), seed=_STATE["seed"], profile=PROFILE,
                                              target_args=_target_args(config), full=kit_mode)
            terminalreporter.write_sep("=", "practice kit summary")
            for line in lines:
                terminalreporter.write_line(line)
