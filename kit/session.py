"""One pytest process's kit session: its configuration, seed, progress stream, reports and traces.

Registered as a pytest plugin by kit/plugin.py, so the hooks that share this state are its methods.
"""
from __future__ import annotations

import json
import os
import random
import time

import pytest
from hypothesis import HealthCheck, Phase, settings

from . import catalogue, failures, show
from .config import KitConfig


def _hypothesis_profile(config: KitConfig) -> settings:
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if config.shrink else [])
    # No explain phase: its tracing slows every call of a failing multi-rank test many times over.
    # print_blob: @reproduce_failure advice is for test authors; the kit prints its own rerun command.
    return settings(max_examples=config.examples, deadline=None, derandomize=False, phases=phases,
                    print_blob=config.verbose,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])


class KitSession:
    def __init__(self, pytest_config, config: KitConfig):
        self.pytest_config, self.config = pytest_config, config
        self._problems = None
        self.reports: list[dict] = []
        self.trace, self.trace_seq = None, 0
        self.hung: set = set()   # the targets (paths) a test has seen hang: later calls get less time
        self.trace_dir = pytest_config.getoption("--kit-trace-dir")
        if not pytest_config.getoption("--hypothesis-profile", default=None):
            settings.register_profile("kit", _hypothesis_profile(config))
            settings.load_profile("kit")
        self.seed = self._seed()
        fd = pytest_config.getoption("--kit-events-fd")
        # closefd=False: a warm test process (kit.server) keeps the descriptor for its next session
        self._events = os.fdopen(fd, "w", buffering=1, encoding="utf-8", closefd=False) if fd is not None else None

    def _seed(self):
        """One seed for the whole session, printed with the summary, so every failure has a rerun command."""
        from hypothesis import core
        seed = self.pytest_config.getoption("--hypothesis-seed", default=None)
        if seed is None:
            seed = (getattr(self.pytest_config, "workerinput", None) or {}).get("kit_seed")
            if seed is None:
                seed = random.SystemRandom().randrange(1, 1 << 24)
            core.global_force_seed = seed
        return int(seed) if str(seed).isdigit() else seed

    # ---- the catalogue and the code under test ----

    def problems(self) -> dict:
        if self._problems is None:
            try:
                self._problems = catalogue.load()
            except catalogue.CatalogueError as e:
                raise pytest.UsageError(str(e)) from None
        return self._problems

    def problem_for(self, path):
        return catalogue.problem_for_path(str(path), self.problems())

    def _chosen(self) -> str | None:
        return "solution" if self.pytest_config.getoption("--solution") else self.config.target

    def target_path(self, problem, param=None) -> str:
        chosen = self._chosen()
        if param is not None:
            return os.path.abspath(param)
        if chosen == "solution":
            return problem.solution_file()
        return os.path.abspath(chosen) if chosen else problem.practice_file()

    def hidden_from_ranks(self) -> tuple:
        """What no rank may read: the kit's answers, its tests (and a hidden set's), its own sources and state.

        A rank needs only the engine, the test helpers and Python: the file under test and the rank
        functions travel to it by content.  The references stay readable when the code under test is one
        of them or a known-wrong version beside one (it loads its reference): the kit judging itself.
        """
        kit_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        judged = [t["path"] for t in json.loads(self.pytest_config.getoption("--kit-targets") or "[]")]
        chosen = self._chosen()
        if chosen == "solution" or not judged and chosen is None:
            judged.append(os.path.join(kit_root, "solutions", "x"))   # --solution, or the learner's own stub
        elif chosen:
            judged.append(os.path.abspath(chosen))
        answers = os.path.join(kit_root, "solutions")
        own = any(os.path.abspath(p).startswith(answers + os.sep) for p in judged)
        hidden = ["practice", "tests", "kit", "judge.py", "problems.yaml", ".git", ".kit"] + ([] if own else ["solutions"])
        hidden = [os.path.join(kit_root, h) for h in hidden] + [self.config.state_dir]
        hidden += [str(p) for p in self.pytest_config.args if os.path.exists(p)]   # the test folders of this run
        return tuple(p for p in hidden if os.path.exists(p))

    def target_args(self) -> list | None:
        """The judge.py arguments that select this session's target again (None: no single target)."""
        if self.pytest_config.getoption("--kit-targets"):
            return None
        chosen = self._chosen()
        return ["--solution"] if chosen == "solution" else ["--target", chosen] if chosen else []

    # ---- progress (judge.py shows it on a TTY) ----

    def progress(self, **event):
        """One event down the judge's events pipe (kit/channel.py); nothing without a judge."""
        if self._events is None:
            return
        try:
            self._events.write(json.dumps(event) + "\n")
        except (OSError, ValueError):   # the judge went away: keep testing, stop reporting
            self._events = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """xdist: every worker draws with the controller's seed, so one rerun command fits them all."""
        node.workerinput["kit_seed"] = self.seed

    def pytest_collection_finish(self, session):
        self.progress(event="collected", count=len(session.items))

    def pytest_runtest_logstart(self, nodeid, location):
        self.progress(event="start", test=nodeid.split("::")[-1])

    # ---- traces: the last traced call of each test (judge.py --trace / --show) ----

    def keep_trace(self, trace):
        """harness.run's ``on_trace``: called with every successful call's trace."""
        if self.trace_dir:
            self.trace = trace
            self.trace_seq += 1

    def save_trace(self, item, report, exc):
        if not self.trace_dir or self.trace is None:
            return
        rank_side = isinstance(exc, failures.PLAIN_WORDS) and not isinstance(exc, AssertionError)
        chrome = show.to_chrome(self.trace)
        chrome["otherData"] = {
            "test": item.name, "outcome": report.outcome,
            # True when the recorded call belongs to the failing example, and that call itself did not fail
            "failing_case_traced": bool(report.failed and getattr(item, "_kit_case_traced", False) and not rank_side),
            "case": getattr(item, "_kit_case", ""),
        }
        cost = dict(report.user_properties).get("cost")
        if cost:   # the test's cost figures (testkit.cost), as counters beside the timeline
            chrome["otherData"]["cost"] = cost
            chrome["traceEvents"] += [{"ph": "C", "pid": "cost", "name": f["figure"], "ts": 0,
                                       "args": {"model": f["model"], "yours": f["yours"]}}
                                      for f in cost["figures"] if all(isinstance(f[k], (int, float))
                                                                      for k in ("model", "yours"))]
        with open(os.path.join(self.trace_dir, show.trace_file_name(item.name)), "w", encoding="utf-8") as f:
            json.dump(chrome, f)
        self.trace = None

    # ---- reports ----

    def add_report(self, report):
        props = dict(report.user_properties)
        entry = {
            "nodeid": report.nodeid, "name": report.nodeid.split("::")[-1], "outcome": report.outcome,
            "duration": report.duration, "points": props.get("kit_points", 1.0),
            "problem": props.get("kit_problem"), "kind": props.get("kit_kind"),
            "message": props.get("kit_message") or (str(report.longrepr) if report.failed else ""),
            "example": props.get("kit_example", ""),
            "hypothesis": props.get("kit_hypothesis", ""),
            "location": props.get("kit_location"),
            "drawing": props.get("drawing"), "cost": props.get("cost"), "file": props.get("kit_file"),
            "target": report.nodeid.rsplit("[", 1)[1].rstrip("]") if "[" in report.nodeid else None,
        }
        self.reports.append(entry)
        self.progress(event="end", test=entry["name"], outcome=entry["outcome"], kind=entry["kind"])

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and (report.failed or report.skipped)):
            self.add_report(report)

    def send_report(self, exitstatus: int, protections: dict):
        """The verdict, last thing in the session, down the events pipe: the judge stops the run once it arrives."""
        self.progress(event="report", report={
            "tests": self.reports, "seed": self.seed, "profile": self.config.profile, "backend": self.config.backend,
            "exitstatus": int(exitstatus), "finished_at": time.time(), "protections": protections})
