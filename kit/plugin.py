"""pytest integration: the ``target`` and ``problem`` fixtures, each problem's policy, profiles, plain-words failures.

Loaded by the root conftest.py, and by judge.py with ``-p kit.plugin`` so that a hidden test
folder outside the repository gets the same behaviour.  Its configuration arrives as ``--kit-*``
options (judge.py passes a ``KitConfig`` that way); their defaults are the user's overrides
(see kit/config.py).  One ``KitSession`` per pytest process holds what the hooks share.

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

import contextlib
import functools
import json

import pytest
from hypothesis import reject
from hypothesis.errors import Unsatisfiable

import harness

from . import failures
from .channel import hold_to_judge
from .config import PROFILES, KitConfig
from . import report as _report
from .session import KitSession

_SESSION = pytest.StashKey[KitSession]()


def pytest_addoption(parser):
    group = parser.getgroup("kit", "distributed-training practice kit")
    group.addoption("--target", default=None, help="judge this implementation file instead of practice/")
    group.addoption("--solution", action="store_true", help="judge the reference in solutions/")
    group.addoption("--kit-profile", choices=sorted(PROFILES), default=None,
                    help="examples per property: quick 10, default 50, thorough 500 (default: KIT_PROFILE)")
    group.addoption("--kit-no-shrink", action="store_true", help="stop at the first failing example (selfcheck)")
    group.addoption("--kit-backend", choices=["gloo", "nccl", "auto"], default=None,
                    help="process-group backend of the problems' ranks (default: KIT_BACKEND, else gloo)")
    group.addoption("--kit-rank-memory-gb", type=float, default=None, help="each rank's resident-memory limit")
    group.addoption("--kit-world-size", type=int, default=None,
                    help="only examples whose worlds have this many ranks; the others are skipped (gpucheck)")
    group.addoption("--kit-no-landlock", action="store_true",
                    help="confine the ranks as on a kernel without Landlock: what the fallback alone does")
    group.addoption("--kit-device-audit", action="store_true",
                    help="rank code's tensors made without naming harness.device() land on meta and fail: "
                         "proves the code device-correct without a GPU")
    group.addoption("--kit-verbose", action="store_true", help="keep hypothesis's own advice (judge.py --verbose)")
    group.addoption("--kit-targets", default=None,
                    help="JSON list of {id, path[, tests][, device_audit]}: run each test once per target, or only "
                         "the tests a target names, under the device audit if it says so (judge.py selfcheck)")
    group.addoption("--kit-events-fd", type=int, default=None,
                    help="write progress events, then the report, as JSON lines to this inherited descriptor "
                         "(judge.py; see kit/channel.py)")
    group.addoption("--kit-lifeline-fd", type=int, default=None,
                    help="end this test process when this inherited pipe closes: its judge is gone (judge.py)")
    group.addoption("--kit-scratch", default=None, help="the judge's scratch folder, removed if the judge dies")
    group.addoption("--kit-deadline", type=float, default=None, help="seconds this test process may live (judge.py)")
    group.addoption("--kit-trace-dir", default=None,
                    help="write each test's last traced call as Chrome trace JSON into this folder (judge.py --show)")


def _config_from_options(config) -> KitConfig:
    env = KitConfig()   # the user's overrides, as defaults
    opt = config.getoption
    return KitConfig(profile=opt("--kit-profile") or env.profile, shrink=not opt("--kit-no-shrink"),
                     world_size=opt("--kit-world-size"), landlock=not opt("--kit-no-landlock"),
                     verbose=bool(opt("--kit-verbose") or config.option.verbose > 0),
                     backend=opt("--kit-backend") or env.backend, target=opt("--target") or env.target,
                     state_dir=env.state_dir, rank_memory_gb=opt("--kit-rank-memory-gb") or env.rank_memory_gb)


def pytest_configure(config):
    lifeline = config.getoption("--kit-lifeline-fd")
    if lifeline is not None and not hasattr(config, "workerinput"):
        hold_to_judge(lifeline, config.getoption("--kit-scratch"), config.getoption("--kit-deadline"),
                      before_exit=harness.shutdown)
    # Start it before the tests import torch, so its own torch import overlaps with theirs.
    # An xdist controller runs no test: only its workers need ranks.
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        harness.prestart()
    try:
        kit_config = _config_from_options(config)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    session = KitSession(config, kit_config)
    config.stash[_SESSION] = session
    config.pluginmanager.register(session, "kit-session")   # its hooks: progress, reports, summary
    session.progress(event="phase", text="starting the ranks")


def _session(config) -> KitSession:
    return config.stash[_SESSION]


def pytest_generate_tests(metafunc):
    targets = metafunc.config.getoption("--kit-targets")
    if targets and "target" in metafunc.fixturenames:
        name = metafunc.function.__name__
        chosen = [t for t in json.loads(targets) if t.get("tests") is None or name in t["tests"]]
        metafunc.parametrize("target", chosen, ids=[t["id"] for t in chosen], indirect=True, scope="module")


@pytest.fixture(scope="module")
def problem(request):
    """The problems.yaml entry of the test file's folder."""
    found = _session(request.config).problem_for(request.node.path)
    if found is None:
        pytest.fail(f"{request.node.path} is not inside a problem folder named <number>_<slug>", pytrace=False)
    return found


@pytest.fixture(scope="module")
def target(request, problem):
    """The implementation under test, as a ``harness.Target`` (loaded only inside the ranks).

    A file that cannot be used fails every test with a ``TargetError`` ("load error").
    """
    entry = getattr(request, "param", None) or {}   # one of --kit-targets
    path = _session(request.config).target_path(problem, entry.get("path"))
    # selfcheck --device-audit: only the reference runs under the audit (a wrong version must fail for its bug)
    with harness.defaults(audit_devices=True) if entry.get("device_audit") else contextlib.nullcontext():
        yield _imported_once(harness.Target(path, problem.names, problem.stand_ins).validate())


def _load_in_a_rank(target):
    """Runs on one rank: import the file under test, and nothing else."""
    target.load()


def _imported_once(target):
    """The file under test, imported once on a rank before any test runs it: an exception at import
    (a missing module, a crash, a hang) is a load error, like a syntax error, said once for every test."""
    try:
        harness.run(_load_in_a_rank, 1, target, reuse=True)
    except harness.WorldSkipped:   # --kit-world-size leaves out worlds of one rank: the tests find out
        pass
    except failures.IMPORT_FAILURES as e:
        raise harness.TargetError(failures.import_failure(target.path, e)) from None
    return target


@pytest.fixture(autouse=True, scope="module")
def _problem_policy(request):
    """Every ``harness.run`` in a problem's tests obeys that problem's ops policy and time limit."""
    session = _session(request.config)
    found = session.problem_for(request.node.path)
    if found is None:
        yield
        return
    import torch
    torch.set_num_threads(1)  # expected values use tiny tensors: threads only add overhead on small machines
    # the reference (--solution) always runs under the device audit: CI's practice run proves it device-correct,
    # so selfcheck need not run it again (--skip-reference)
    audited = request.config.getoption("--kit-device-audit") or request.config.getoption("--solution")
    audit = {"audit_devices": True} if audited else {}   # else: the target's
    probes = [{"compute": harness.Compute, "flops": harness.Flops}[name]() for name in found.probes]
    with harness.defaults(forbid=found.forbidden_ops, allow=found.allowed_ops, timeout=found.time_limit, probes=probes,
                          hidden=session.hidden_from_ranks(), landlock=session.config.landlock,
                          stop_on_hang=True, backend=session.config.backend,
                          memory_gb=session.config.rank_memory_gb, on_trace=session.keep_trace,
                          world_sizes=None if session.config.world_size is None else (session.config.world_size,),
                          **audit):
        yield


@pytest.fixture(autouse=True)
def _less_time_after_a_hang(request):
    """Once a test of this code has hung, each later call of it gets ``after_a_hang(time_limit)`` seconds:
    the properties that run the same code would each wait out the whole limit, for the same deadlock."""
    session = _session(request.config)
    found = session.problem_for(request.node.path)
    target = request.getfixturevalue("target") if found is not None and "target" in request.fixturenames else None
    if target is None or target.path not in session.hung:
        yield
        return
    request.node._kit_hang_budget = (after_a_hang(found.time_limit), found.time_limit)
    with harness.defaults(timeout=request.node._kit_hang_budget[0]):
        yield


def after_a_hang(time_limit: float) -> float:
    """A call's time limit once the same code has hung: a fifth of the problem's, at least a second."""
    return min(time_limit, max(1.0, time_limit / 5))


def pytest_sessionfinish(session, exitstatus):
    protections = harness.protections()   # what confined this session's ranks (shutdown forgets it)
    harness.shutdown()
    if not hasattr(session.config, "workerinput"):
        _session(session.config).send_report(exitstatus, protections)


# ---- each example: progress, the failing case, the trace of the failing call -------------------

@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    """Wrap hypothesis's inner test: count examples (progress) and remember the last failing one.

    After shrinking, hypothesis replays the smallest failing example last, so the last
    failing call is the case to show, and a trace it recorded is that case's timeline.
    """
    session = _session(item.config)
    session.trace = None
    item._kit_case, item._kit_case_traced = "", False
    hyp = getattr(getattr(item, "obj", None), "hypothesis", None)
    inner = getattr(hyp, "inner_test", None)
    if inner is None:
        seq = session.trace_seq
        yield
        item._kit_case_traced = session.trace_seq > seq
        return
    fixtures = set(getattr(item, "fixturenames", ()))
    examples = getattr(getattr(item.obj, "_hypothesis_internal_use_settings", None), "max_examples",
                       session.config.examples)
    counts = {"calls": 0, "failed": False}

    @functools.wraps(inner)
    def counted(*args, **kwargs):
        counts["calls"] += 1
        session.progress(event="example", test=item.name, n=counts["calls"], of=examples,
                         phase="shrinking" if counts["failed"] else "generating")
        seq = session.trace_seq
        try:
            return inner(*args, **kwargs)
        except harness.WorldSkipped:
            reject()   # a world size left out (--kit-world-size): this example does not count
        except BaseException as e:
            counts["failed"] = True
            item._kit_case = failures.format_draw(kwargs, fixtures)
            item._kit_case_traced = session.trace_seq > seq
            failures.remember_case(e, item._kit_case)   # several failures: each keeps its own case
            raise

    hyp.inner_test = counted
    try:
        yield
    finally:
        hyp.inner_test = inner


# ---- failures in plain words -------------------------------------------------------------------

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.when != "call" and not (report.failed and report.when == "setup"):
        return
    session = _session(item.config)
    found = session.problem_for(item.path)
    props = report.user_properties
    props += [("kit_points", found.points_for(item.name) if found else 1.0),
              ("kit_problem", found.number if found else None), ("kit_file", str(item.path))]
    exc = None
    if report.failed and call.excinfo is not None and _left_out(call.excinfo.value, session):
        report.outcome, report.longrepr = "skipped", (str(item.path), 0, f"Skipped: no example with a world of "
                                                      f"{session.config.world_size} ranks")
    elif report.failed and call.excinfo is not None:
        exc = failures.first_exception(call.excinfo.value)
        target_path = getattr(getattr(item, "funcargs", {}).get("target"), "path", None)
        kind, message = failures.explain(exc, target_path)
        if kind == "hang":
            session.hung.add(target_path)
            if getattr(item, "_kit_hang_budget", None):
                message += failures.shortened_limit(*item._kit_hang_budget)
        stopped_early = kind in (failures.NOT_IMPLEMENTED, failures.LOAD_ERROR)
        case = "" if stopped_early else failures.case_of(exc, failures.case_remembered(exc) or
                                                         getattr(item, "_kit_case", ""))
        notes = (failures.hypothesis_notes(call.excinfo.value), getattr(item, "hypothesis_report_information", ""))
        props += [("kit_kind", kind), ("kit_message", message), ("kit_example", case),
                  ("kit_hypothesis", "\n\n".join(x for x in notes if x))]
        if kind == failures.NOT_IMPLEMENTED and exc.frames:
            props.append(("kit_location", list(exc.frames[-1][:3])))
        if isinstance(exc, failures.PLAIN_WORDS):
            report.longrepr = f"[{kind}] {message}" + (f"\n\nfailing case: {case}" if case else "")
    if report.when == "call":
        session.save_trace(item, report, exc)


def _left_out(exc, session) -> bool:
    """--kit-world-size left out every world this test starts."""
    return session.config.world_size is not None and isinstance(failures.first_exception(exc),
                                                                (harness.WorldSkipped, Unsatisfiable))


# ---- plain `pytest practice/`: the kit's summary -----------------------------------------------

def _kit_mode(config, terminal, session: KitSession) -> bool:
    """Replace pytest's failure sections only when nothing is lost: default options, and every
    failure belongs to a problem's tests (so a broken harness test still shows its traceback)."""
    if config.getoption("--kit-events-fd") is not None or config.getoption("--kit-targets"):
        return False
    if config.option.verbose > 0 or config.option.tbstyle != "auto" or config.option.reportchars not in ("fE", "Ef"):
        return False
    failed = terminal.stats.get("failed", []) + terminal.stats.get("error", [])
    ours = {r["nodeid"] for r in session.reports if r["problem"] is not None}
    return bool(ours) and all(getattr(r, "nodeid", None) in ours for r in failed)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = _session(config)
    if hasattr(config, "workerinput") or not any(r["problem"] is not None for r in session.reports):
        return (yield)
    kit_mode = _kit_mode(config, terminalreporter, session)
    if kit_mode:
        # pytest's own sections would repeat every stub's NotImplementedError; the kit's summary replaces them
        config.option.tbstyle = "no"
        terminalreporter.reportchars = terminalreporter.reportchars.replace("f", "").replace("E", "")
    try:
        return (yield)
    finally:
        if config.option.verbose <= 0 or kit_mode:
            lines = _report.pytest_summary(session.reports, session.problems(), seed=session.seed,
                                          profile=session.config.profile, target_args=session.target_args(),
                                          full=kit_mode)
            terminalreporter.write_sep("=", "practice kit summary")
            for line in lines:
                terminalreporter.write_line(line)
