"""pytest integration: the ``target`` fixture, the problem's policy, shared profiles, plain-words failures.

Loaded by the root conftest.py, and by judge.py with ``-p harness.pytest_plugin``
so that a hidden test folder outside the repository gets the same behaviour.

Choosing the code under test, in order of precedence:
    --target FILE          a student's file or a known-wrong version
    --solution             the reference in solutions/
    KIT_TARGET=FILE|solution
    (default)              the learner's stub in practice/
"""
from __future__ import annotations

import json
import os
import time

import sys

import pytest
from hypothesis import HealthCheck, Phase, settings

from . import catalogue
from ._boot import start_forkserver
from .properties import PropertyFailed
from .errors import (HangError, HangStopped, HarnessError, NotImplementedYet, RankCrashed, TargetError,
                     TraceTampered)
from .target import Target

PROFILES = {"quick": 10, "default": 50, "thorough": 500}
# selfcheck only needs to know that a known-wrong version fails, not its smallest example
# No explain phase: its tracing slows every call of a failing multi-rank test many times over.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate]
if not os.environ.get("KIT_NO_SHRINK"):
    _PHASES.append(Phase.shrink)
for _name, _examples in PROFILES.items():
    settings.register_profile(
        _name, max_examples=_examples, deadline=None, print_blob=True, derandomize=False, phases=_PHASES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
settings.load_profile(os.environ.get("KIT_PROFILE", "default"))


def pytest_configure(config):
    # Start it before the tests import torch, so its own torch import overlaps with theirs.
    # An xdist controller runs no test: only its workers need ranks.
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        start_forkserver()


def pytest_addoption(parser):
    group = parser.getgroup("kit", "distributed-training practice kit")
    group.addoption("--target", default=None, help="judge this implementation file instead of practice/")
    group.addoption("--solution", action="store_true", help="judge the reference in solutions/")
    group.addoption("--kit-report", default=None, help="write a JSON report of every test (used by judge.py)")
    group.addoption("--kit-targets", default=None,
                    help="JSON list of {id, path}: run every test once per target (judge.py selfcheck)")


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


@pytest.fixture(scope="module")
def problem(request):
    """The problems.yaml entry of the test file's folder."""
    return _problem_of(request)


@pytest.fixture(scope="module")
def target(request, problem):
    """The implementation under test, as a ``harness.Target`` (loaded only inside the ranks)."""
    try:
        path = _target_path(request.config, problem, getattr(request, "param", None))
        return Target(path, problem.names).validate()
    except TargetError as e:
        error = str(e)
    pytest.fail(error, pytrace=False)


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
            json.dump({"tests": _REPORTS, "finished_at": time.time()}, f, indent=1)


# ---- failures in plain words -------------------------------------------------------------------

def _first_exception(exc):
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _example(exc) -> str:
    notes = getattr(exc, "__notes__", None) or []
    return "\n".join(n for n in notes if not n.startswith("You can reproduce")).strip()


def explain(exc) -> tuple[str, str]:
    """(kind, message) for a failure; kind is what judge.py shows in its table."""
    if isinstance(exc, NotImplementedYet):
        return "not implemented", str(exc)
    if isinstance(exc, (HangError, HangStopped)):
        return "hang", str(exc)
    if isinstance(exc, RankCrashed):
        return "crash", str(exc)
    if isinstance(exc, PropertyFailed):
        return "property", str(exc)
    if isinstance(exc, TraceTampered):
        return "tampered", str(exc)
    if isinstance(exc, HarnessError):
        return type(exc).__name__, str(exc)
    if isinstance(exc, AssertionError):
        return "property", str(exc) or "assertion failed"
    return "error", f"{type(exc).__name__}: {exc}"


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
    if report.failed and call.excinfo is not None:
        exc = _first_exception(call.excinfo.value)
        kind, message = explain(exc)
        example = _example(exc)
        report.user_properties.append(("kit_kind", kind))
        report.user_properties.append(("kit_message", message))
        report.user_properties.append(("kit_example", example))
        if isinstance(exc, (HarnessError, PropertyFailed, HangStopped, NotImplementedYet, TraceTampered)):
            text = f"[{kind}] {message}"
            if example:
                text += "\n\n" + example
            report.longrepr = text


_REPORTS: list = []


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and (report.failed or report.skipped)):
        props = dict(report.user_properties)
        _REPORTS.append({
            "nodeid": report.nodeid, "name": report.nodeid.split("::")[-1], "outcome": report.outcome,
            "duration": report.duration, "points": props.get("kit_points", 1.0),
            "problem": props.get("kit_problem"), "kind": props.get("kit_kind"),
            "message": props.get("kit_message") or (str(report.longrepr) if report.failed else ""),
            "example": props.get("kit_example", ""),
            "target": _target_id(report.nodeid),
        })


def _target_id(nodeid: str):
    """The id of the --kit-targets parameter in a node id like ``test_x[wrong:no_avg]``."""
    if "[" not in nodeid:
        return None
    return nodeid.rsplit("[", 1)[1].rstrip("]")
