#!/usr/bin/env python
"""Judge your distributed-training practice problems.

    python judge.py                      list problems, your progress, and what to do next
    python judge.py 113                  judge practice/113_*/ (your file)
    python judge.py 113 --solution       judge the reference
    python judge.py 113 --target F.py    judge any file (a student's, a known-wrong version)
    python judge.py 113 --tests DIR      use another test set laid out like practice/ (hidden tests)
    python judge.py 113 --hint           show the next hint
    python judge.py 113 --watch          re-judge on every save: the score and the first failure
    python judge.py 113 --reset          restore the stub (your file is backed up)
    python judge.py 113 --trace t.json   write a timeline (Perfetto / chrome://tracing): the failing case's, if any
    python judge.py 113 --show           draw that timeline in the terminal
    python judge.py 113 --verbose        also show hypothesis's own output under each failure
    python judge.py selfcheck [N ...]    reference passes, stub scores 0, every known-wrong version fails
    python judge.py grade 113 DIR --out grades.csv     grade a folder of submissions

Exit codes: 0 all passed, 1 some failed, 2 interrupted, 3 internal error, 4 usage error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

from harness import catalogue, report, workflows  # noqa: E402
from harness.judging import InternalError, UsageError, judge_once  # noqa: E402

EXIT_PASS, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2, 3, 4


def _problem(problems: dict, text: str):
    if not text.isdigit() or int(text) not in problems:
        valid = ", ".join(str(n) for n in sorted(problems))
        raise UsageError(f"no problem {text!r}. Valid problems: {valid}. Run 'python judge.py' to list them.")
    return problems[int(text)]


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as a usage error (exit 4), like every other one."""

    def error(self, message):
        raise UsageError(f"{message}\n{self.format_usage().strip()}\nRun 'python judge.py --help' for every option.")


def _parser() -> argparse.ArgumentParser:
    summary, _, details = __doc__.partition("\n\n")
    p = _Parser(prog="judge.py", description=summary, formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog=details)
    p.add_argument("problem", nargs="?", help="problem number, or 'selfcheck' / 'grade'")
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--solution", action="store_true", help="judge the reference in solutions/")
    which.add_argument("--target", metavar="FILE", help="judge this file instead of practice/")
    p.add_argument("--tests", metavar="DIR", help="test set laid out like practice/ (e.g. hidden tests)")
    p.add_argument("--seed", type=int, help="hypothesis seed (printed with every run, for replay)")
    p.add_argument("--profile", choices=["quick", "default", "thorough"], default="default",
                   help="examples per property: about 10, 50, 500")
    p.add_argument("-k", dest="select", metavar="EXPR", help="only tests matching this pytest -k expression")
    p.add_argument("--format", choices=["text", "json", "gradescope"], default="text")
    p.add_argument("--output", metavar="FILE", help="write the report here instead of stdout")
    p.add_argument("--hint", action="store_true", help="show the next hint for this problem")
    p.add_argument("--watch", action="store_true", help="re-judge on every save of your file")
    p.add_argument("--reset", action="store_true", help="restore the stub, after asking; keeps a backup")
    p.add_argument("--yes", action="store_true", help="answer yes to --reset's question")
    p.add_argument("--trace", metavar="FILE",
                   help="write a timeline as Chrome trace-event JSON: a failing test's failing case, else a passing one")
    p.add_argument("--show", action="store_true", help="draw that timeline in the terminal")
    p.add_argument("--out", metavar="CSV", help="grade: where to write the gradebook (CSV, plus JSON beside it)")
    p.add_argument("--jobs", type=int, help="grade: submissions judged in parallel (default: CPU cores)")
    p.add_argument("--timeout", type=float, default=600, help="grade: seconds per submission")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="also show hypothesis's own output under each failure")
    p.add_argument("--brief", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        problems = catalogue.load()
    except catalogue.CatalogueError as e:
        print(f"problems.yaml: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.problem is None:
            return cmd_list(problems)
        if args.problem == "selfcheck":
            return cmd_selfcheck(problems, args)
        if args.problem == "grade":
            return cmd_grade(problems, args)
        if args.rest:
            raise UsageError(f"unexpected arguments: {' '.join(args.rest)}")
        problem = _problem(problems, args.problem)
        if args.hint:
            return cmd_hint(problem)
        if args.reset:
            print(workflows.reset(problem, ask=(lambda _q: "y") if args.yes else input))   # EOF: UsageError
            return EXIT_PASS
        if args.watch:
            return cmd_watch(problem, args)
        if args.trace or args.show:
            return cmd_trace(problem, args)
        return cmd_judge(problem, args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except InternalError as e:
        print(f"internal error: {e}", file=sys.stderr)
        return EXIT_INTERNAL


def _target(problem, args) -> tuple[str, list]:
    """(path, the judge.py arguments that select it again, for replay commands)."""
    if args.solution:
        return problem.solution_file(), ["--solution"]
    if args.target:
        path = os.path.abspath(args.target)
        if not os.path.isfile(path):
            raise UsageError(f"target file not found: {args.target}")
        return path, ["--target", args.target]
    return problem.practice_file(), []


def _validate(problem, path, scored: bool = False):
    """A file that cannot be used is a usage error in plain words.  ``scored`` (json, gradescope,
    grading): an existing file that fails to load is judged anyway, every test failing with
    "load error", so the gradebook still has its row, its maximum and the reason."""
    from harness.errors import TargetError
    from harness.target import Target
    try:
        Target(path, problem.names).validate()
    except TargetError as e:
        if not (scored and os.path.isfile(path)):
            raise UsageError(str(e)) from None


class _LiveProgress:
    """On a terminal: which test is running, which example, and how many tests are done (rich progress).

    Without a terminal (a pipe, a file, CI, grading) it shows nothing at all.
    """

    def __init__(self, enabled: bool, what: str):
        self.enabled, self.what = enabled, what
        self.bar = self.task = None
        self.done = 0

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                TextColumn("{task.completed}/{task.total} tests"), TimeElapsedColumn(),
                                console=report.console(), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task(f"{self.what}: starting", total=None)
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, event: dict):
        if self.bar is None:
            return
        kind = event.get("event")
        if kind == "phase":
            self.bar.update(self.task, description=f"{self.what}: {event.get('text', '')}")
        elif kind == "collected":
            self.bar.update(self.task, total=event.get("count") or None)
        elif kind == "start":
            self.bar.update(self.task, description=f"{self.what}: {event.get('test', '')}")
        elif kind == "example":
            if event.get("phase") == "shrinking":
                text = f"{event['test']}: failed; shrinking to the smallest case (try {event['n']})"
            else:
                text = f"{event['test']}: example {event['n']} of about {event['of']}"
            self.bar.update(self.task, description=f"{self.what}: {text}")
        elif kind == "end":
            self.done += 1
            self.bar.update(self.task, completed=self.done)


def _live(args, what: str) -> _LiveProgress:
    return _LiveProgress(sys.stdout.isatty() and args.format == "text" and not args.output, what)


def cmd_judge(problem, args) -> int:
    path, target_args = _target(problem, args)
    _validate(problem, path, scored=args.format != "text")
    if args.tests and not os.path.isdir(args.tests):
        raise UsageError(f"--tests: folder not found: {args.tests}")
    with _live(args, f"judging {problem.number}") as live:
        verdict = judge_once(problem, path, tests_root=args.tests, profile=args.profile, seed=args.seed,
                             select=args.select, progress=live if live.enabled else None, verbose=args.verbose)
    if not verdict.tests:
        raise UsageError(f"no tests matched in {verdict.tests_dir}" + (f" for -k {args.select!r}" if args.select else ""))
    if args.tests:
        target_args = target_args + ["--tests", args.tests]
    if args.format == "text":
        report.render_text(verdict, target_args, brief=args.brief, verbose=args.verbose) if not args.output else \
            report.write(verdict, "text", args.output, target_args, verbose=args.verbose)
    else:
        report.write(verdict, args.format, args.output, target_args)
    # Progress is the score of a complete run of the learner's own file on the public tests.
    if path == problem.practice_file() and not args.select and not args.tests:
        workflows.record_result(problem, verdict.score, verdict.max_score, verdict.all_passed)
    return EXIT_PASS if verdict.all_passed else EXIT_FAIL


def cmd_list(problems) -> int:
    from rich.table import Table
    from rich.text import Text
    con = report.console()
    state = workflows.load_state()
    table = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("#", "problem", "difficulty", "topic", "status"):
        table.add_column(col, overflow="fold")
    for n in sorted(problems):
        p = problems[n]
        status = workflows.status_of(p, state)
        style = "green" if status == "passed" else "yellow" if status.startswith("failing") else "dim"
        table.add_row(str(n), p.display_title, p.difficulty, p.topic, Text(status, style=style))
    con.print(table)
    nxt = workflows.next_problem(problems, state)
    if nxt is None:
        con.print(Text("Every problem passes. Try --profile thorough, or grade yourself on hidden tests.", style="green"))
    else:
        con.print(Text(f"next: read practice/{nxt.folder}/README.md, then run: python judge.py {nxt.number}",
                       style="bold"))
    return EXIT_PASS


def cmd_hint(problem) -> int:
    index, text = workflows.next_hint(problem)
    if text is None:
        print(f"No more hints for {problem.number}: you have seen all {len(problem.hints)}. "
              f"The statement is practice/{problem.folder}/README.md.")
    else:
        print(f"Hint {index}/{len(problem.hints)} for {problem.number}: {text}")
    return EXIT_PASS


def cmd_watch(problem, args) -> int:
    import signal
    import subprocess
    path, target_args = _target(problem, args)
    cmd = [sys.executable, os.path.join(ROOT, "judge.py"), str(problem.number), *target_args, "--brief",
           "--profile", "quick" if args.profile == "default" else args.profile]
    if args.select:
        cmd += ["-k", args.select]
    if args.tests:
        cmd += ["--tests", args.tests]
    print(f"watching {os.path.relpath(path)}: save it to re-judge; Ctrl-C to stop")

    def rejudge():
        print("\n" + "─" * 60, flush=True)
        # A fresh process each time, so edits are picked up.  Its own session: on Ctrl-C we
        # interrupt it ourselves, and it takes its test process and ranks down before exiting.
        child = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
        try:
            child.wait()
        except KeyboardInterrupt:
            _signal_group(child.pid, signal.SIGINT)
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(child.pid, signal.SIGKILL)
                child.wait()
            raise

    try:
        workflows.watch(path, rejudge)
    except KeyboardInterrupt:
        print("\nstopped watching")
    return EXIT_PASS


def _signal_group(pid: int, sig):
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # it had already finished
        pass


def _pick_trace(problem, verdict, traces: dict):
    """(test, chrome) to draw: a failing test's failing case first; else the problem's trace test, passing.

    A test that failed inside the ranks left no timeline of its failing call, and one still
    stopped by the stub has none at all: neither is drawn in its place.
    """
    def failing_case_traced(t):
        return t.name in traces and traces[t.name].get("otherData", {}).get("failing_case_traced")
    for t in verdict.failures():
        if t.kind != "not implemented" and failing_case_traced(t):
            return t, traces[t.name]
    passing = [t for t in verdict.tests if t.passed and t.name in traces]
    passing.sort(key=lambda t: t.name.split("[")[0] != problem.trace_test)
    return (passing[0], traces[passing[0].name]) if passing else (None, None)


def cmd_trace(problem, args) -> int:
    import shutil
    from rich.text import Text
    from harness import timeline
    path, target_args = _target(problem, args)
    _validate(problem, path)
    if args.tests:
        target_args = target_args + ["--tests", args.tests]
    con = report.console()
    with tempfile.TemporaryDirectory(prefix="kit-trace-") as trace_dir:
        with _live(args, f"tracing {problem.number}") as live:
            verdict = judge_once(problem, path, tests_root=args.tests, profile="quick", seed=args.seed,
                                 select=args.select, trace_dir=trace_dir, progress=live if live.enabled else None)
        if not verdict.tests:
            raise UsageError(f"no tests matched in {verdict.tests_dir}" + (f" for -k {args.select!r}" if args.select else ""))
        traces = {}
        for t in verdict.tests:
            file = os.path.join(trace_dir, timeline.trace_file_name(t.name))
            if os.path.exists(file):
                with open(file, encoding="utf-8") as f:
                    traces[t.name] = json.load(f)
        chosen, chrome = _pick_trace(problem, verdict, traces)
        report.render_text(verdict, target_args, brief=True)
        if chosen is None:
            stubs = report.not_implemented_groups(verdict.failures())
            untraced = [t for t in verdict.failures() if t.kind != "not implemented"]
            if untraced:
                why = (f"{untraced[0].name} failed inside the ranks ({untraced[0].kind}), so its failing call "
                       "left no timeline, and no test passed with one")
            elif stubs:
                why = "no test got as far as a multi-rank call: they stop at the stub's NotImplementedError (above)"
            else:
                why = "no multi-rank call ran in " + ("the tests matching -k " + repr(args.select) if args.select
                                                       else "this problem's tests")
            con.print(Text(f"nothing to draw: {why}", style="yellow"), soft_wrap=True)
            return EXIT_USAGE if args.select and not verdict.failures() else EXIT_FAIL
        state = "failing" if not chosen.passed else "passing"
        con.print()
        con.print(Text(f"timeline of {chosen.name} ({state})" +
                       (f", failing case: {chosen.example}" if not chosen.passed and chosen.example else
                        ", its last traced call"), style="bold"), soft_wrap=True)
        if args.trace:
            shutil.copyfile(os.path.join(trace_dir, timeline.trace_file_name(chosen.name)), args.trace)
            con.print(f"wrote {args.trace}: open it in https://ui.perfetto.dev or chrome://tracing")
    if args.show:
        text = Text()
        for piece, style in timeline.render_lanes(chrome):
            text.append(piece, style=style)
        con.print(text)
        if problem.number == 118:
            _show_pipeline(problem, path, con)
    return EXIT_PASS if verdict.all_passed else EXIT_FAIL


def _show_pipeline(problem, path, con):
    try:
        from harness import pipeline_grid
    except ImportError:
        return
    con.print(pipeline_grid.show_for_target(path))


def cmd_selfcheck(problems, args) -> int:
    from rich.table import Table
    from rich.text import Text
    chosen = [_problem(problems, n) for n in args.rest] if args.rest else [problems[n] for n in sorted(problems)]
    if args.tests and not os.path.isdir(args.tests):
        raise UsageError(f"--tests: folder not found: {args.tests}")
    rows = []
    for problem in chosen:
        with _live(args, f"selfcheck {problem.number}") as live:
            rows += workflows.selfcheck_problem(
                problem, tests_root=args.tests, profile=args.profile if args.profile != "default" else "quick",
                seed=args.seed if args.seed is not None else 0, progress=live if live.enabled else None)
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        con = report.console()
        table = Table(show_edge=False, pad_edge=False, box=None)
        for col in ("problem", "target", "", "detail"):
            table.add_column(col, overflow="fold")
        for r in rows:
            verdict = (Text("skip", style="yellow") if r.get("skipped") else
                       Text("ok", style="green") if r["ok"] else Text("SURPRISE", style="bold red"))
            table.add_row(str(r["problem"]), r["target"], verdict, r["detail"])
        con.print(table)
        bad = [r for r in rows if not r["ok"]]
        con.print(Text(f"{len(rows) - len(bad)} of {len(rows)} checks as expected", style="red" if bad else "green"))
    return EXIT_FAIL if any(not r["ok"] for r in rows) else EXIT_PASS


def cmd_grade(problems, args) -> int:
    from rich.progress import Progress
    from rich.table import Table
    if len(args.rest) != 2 or not args.out:
        raise UsageError("usage: python judge.py grade <problem> <submissions folder> --out grades.csv")
    problem = _problem(problems, args.rest[0])
    if args.tests and not os.path.isdir(args.tests):
        raise UsageError(f"--tests: folder not found: {args.tests}")
    seed = args.seed if args.seed is not None else 0   # one seed for the whole class: same cases for everyone
    count = len(workflows.find_submissions(args.rest[1], problem))
    con = report.console()
    with Progress(console=con, transient=not con.is_terminal) as bar:
        task = bar.add_task(f"grading {count} submissions for {problem.number}", total=count)
        results = workflows.grade(problem, args.rest[1], args.out, profile=args.profile, seed=seed,
                                  tests_root=args.tests, jobs=args.jobs, timeout=args.timeout,
                                  progress=lambda r: bar.advance(task))
    table = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("student", "score", "status"):
        table.add_column(col, overflow="fold")
    for r in results:
        max_score = r.get("max_score")
        table.add_row(r["student"], f"{r['score']:g}/{max_score:g}" if max_score else f"{r['score']:g}", r["status"])
    con.print(table)
    summary = workflows.common_failures(results)
    if summary:
        con.print("most common failing properties:")
        for s in summary:
            con.print(f"  {s['students']} × {s['test']} ({s['kind']}): {s['example']}")
    con.print(f"wrote {args.out} and {os.path.splitext(args.out)[0]}.json")
    return EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
