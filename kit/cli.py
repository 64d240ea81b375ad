"""judge.py's commands: parse the command line into a ``KitConfig`` and a command, run it, map errors to exit codes."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from . import catalogue, report, show, stubs
from .config import PROFILES, KitConfig
from harness import protections_here

from .channel import scratch
from .grade import common_failures, find_submissions, grade
from .judging import InternalError, UsageError, env_for_tests, judge_once
from .live import live
from .progress import Progress, next_problem, status_of
from .selfcheck import selfcheck_problem
from .warm import WarmTests
from .watch import watch

EXIT_PASS, EXIT_FAIL, EXIT_INTERRUPTED, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2, 3, 4


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as a usage error (exit 4), like every other one."""

    def error(self, message):
        raise UsageError(f"{message}\n{self.format_usage().strip()}\nRun 'python judge.py --help' for every option.")


def parser(doc: str) -> argparse.ArgumentParser:
    summary, _, details = doc.partition("\n\n")
    p = _Parser(prog="judge.py", description=summary, formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog=details)
    p.add_argument("problem", nargs="?", help="problem number, or 'selfcheck' / 'grade'")
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--solution", action="store_true", help="judge the reference in solutions/")
    which.add_argument("--target", metavar="FILE", help="judge this file instead of practice/")
    p.add_argument("--tests", metavar="DIR", help="test set laid out like practice/ (e.g. hidden tests)")
    p.add_argument("--seed", type=int, help="hypothesis seed (printed with every run, for replay)")
    p.add_argument("--profile", choices=list(PROFILES), default=None,
                   help="examples per property: about 10, 50, 500 (default: default, or KIT_PROFILE)")
    p.add_argument("-k", dest="select", metavar="EXPR", help="only tests matching this pytest -k expression")
    p.add_argument("--backend", choices=["gloo", "nccl", "auto"], default=None,
                   help="the ranks' process-group backend: gloo (CPU, the default), nccl (one GPU per rank), "
                        "or auto (NCCL for each world that has a GPU per rank)")
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
    p.add_argument("--no-landlock", action="store_true",
                   help="confine the ranks as on a kernel without Landlock (see what the fallback alone does)")
    p.add_argument("--sealed", action="store_true",
                   help="refuse to grade unless every protection is in force (Landlock, seccomp, the ranks' own "
                        "uid when root, the file witness): a verdict a cheater cannot have forged")
    p.add_argument("--device-audit", action="store_true",
                   help="selfcheck: the reference also runs under the device audit (tensors on harness.device())")
    p.add_argument("--brief", action="store_true", help=argparse.SUPPRESS)
    return p


def config_of(args, profile: str | None = None) -> KitConfig:
    """The run's configuration: the command line first, then the user's overrides (kit/config.py)."""
    base = KitConfig()
    return KitConfig(profile=profile or args.profile or base.profile, verbose=args.verbose,
                     backend=args.backend or base.backend, landlock=not args.no_landlock)


def main(doc: str, argv=None) -> int:
    try:
        args = parser(doc).parse_args(argv)
        config_of(args)   # a bad KIT_* override is a usage error too
    except (UsageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        problems = catalogue.load()
    except catalogue.CatalogueError as e:
        print(f"problems.yaml: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _dispatch(problems, args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except InternalError as e:
        print(f"internal error: {e}", file=sys.stderr)
        return EXIT_INTERNAL


def _dispatch(problems, args) -> int:
    if args.sealed:
        _require_sealing(protections_here())
    if args.problem is None:
        return cmd_list(problems)
    if args.problem == "selfcheck":
        return cmd_selfcheck(problems, args)
    if args.problem == "grade":
        return cmd_grade(problems, args)
    if args.rest:
        raise UsageError(f"unexpected arguments: {' '.join(args.rest)}")
    problem = _problem(problems, args.problem)
    _check_backend([problem], config_of(args))
    if args.hint:
        return cmd_hint(problem)
    if args.reset:
        print(stubs.reset(problem, KitConfig().state_dir, ask=(lambda _q: "y") if args.yes else input))
        return EXIT_PASS
    if args.watch:
        return cmd_watch(problem, args)
    if args.trace or args.show:
        return cmd_trace(problem, args)
    return cmd_judge(problem, args)


def _require_sealing(protections: dict):
    """--sealed: refuse to run where the ranks cannot be sealed in (before anything starts)."""
    if not protections.get("sealed"):
        raise UsageError("--sealed: this machine cannot seal the ranks in, so no verdict here could be trusted "
                         "against a cheater; missing: " + "; ".join(protections.get("missing") or []))


def _check_backend(chosen: list, config: KitConfig):
    """NCCL needs one GPU per rank of the largest world the problems' tests start."""
    if config.backend != "nccl":
        return
    from harness import gpu_count
    gpus, needed = gpu_count(), max(p.max_world_size for p in chosen)
    if gpus < needed:
        raise UsageError(f"--backend nccl needs one GPU per rank: the tests start worlds of up to {needed} ranks, "
                         f"and this machine has {gpus} GPU{'' if gpus == 1 else 's'}. Use --backend gloo (CPU), "
                         "--backend auto (NCCL where a world fits), or python -m kit.gpucheck (the sizes that fit)")


def _problem(problems: dict, text: str):
    if not text.isdigit() or int(text) not in problems:
        valid = ", ".join(str(n) for n in sorted(problems))
        raise UsageError(f"no problem {text!r}. Valid problems: {valid}. Run 'python judge.py' to list them.")
    return problems[int(text)]


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
    """A file that cannot be used is a usage error in plain words.  ``scored`` (json, gradescope):
    an existing file that fails to load is judged anyway, every test failing with "load error",
    so the report still has its score, its maximum and the reason."""
    from harness import Target, TargetError
    try:
        Target(path, problem.names).validate()
    except TargetError as e:
        if not (scored and os.path.isfile(path)):
            raise UsageError(str(e)) from None


def _tests_root(args) -> str | None:
    if args.tests and not os.path.isdir(args.tests):
        raise UsageError(f"--tests: folder not found: {args.tests}")
    return args.tests


def _no_tests(verdict, args) -> UsageError:
    return UsageError(f"no tests matched in {verdict.tests_dir}" + (f" for -k {args.select!r}" if args.select else ""))


def cmd_judge(problem, args) -> int:
    path, target_args = _target(problem, args)
    _validate(problem, path, scored=args.format != "text")
    tests_root = _tests_root(args)
    with live(args, f"judging {problem.number}") as bar:
        verdict = judge_once(problem, path, config_of(args), tests_root=tests_root, seed=args.seed,
                             select=args.select, progress=bar if bar.enabled else None)
    if not verdict.tests:
        raise _no_tests(verdict, args)
    if args.sealed and not verdict.protections.get("sealed"):
        raise InternalError("--sealed: the ranks of this run were not sealed in: "
                            + "; ".join(verdict.protections.get("missing") or ["no rank reported"]))
    if tests_root:
        target_args = target_args + ["--tests", tests_root]
    if args.format == "text" and not args.output:
        report.render_text(verdict, target_args, brief=args.brief, verbose=args.verbose)
    else:
        report.write(verdict, args.format, args.output, target_args, verbose=args.verbose)
    # Progress is the score of a complete run of the learner's own file on the public tests.
    if path == problem.practice_file() and not args.select and not tests_root:
        Progress(KitConfig().state_dir).record_result(problem, verdict.score, verdict.max_score, verdict.all_passed)
    return EXIT_PASS if verdict.all_passed else EXIT_FAIL


def cmd_list(problems) -> int:
    from rich.table import Table
    from rich.text import Text
    con = report.console()
    state = Progress(KitConfig().state_dir).load()
    table = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("#", "problem", "difficulty", "topic", "status"):
        table.add_column(col, overflow="fold")
    for n in sorted(problems):
        p = problems[n]
        status = status_of(p, state)
        style = "green" if status == "passed" else "yellow" if status.startswith("failing") else "dim"
        table.add_row(str(n), p.display_title, p.difficulty, p.topic, Text(status, style=style))
    con.print(table)
    nxt = next_problem(problems, state)
    if nxt is None:
        con.print(Text("Every problem passes. Try --profile thorough, or grade yourself on hidden tests.", style="green"))
    else:
        con.print(Text(f"next: read practice/{nxt.folder}/README.md, then run: python judge.py {nxt.number}",
                       style="bold"))
    return EXIT_PASS


def cmd_hint(problem) -> int:
    index, text = Progress(KitConfig().state_dir).next_hint(problem)
    if text is None:
        print(f"No more hints for {problem.number}: you have seen all {len(problem.hints)}. "
              f"The statement is practice/{problem.folder}/README.md.")
    else:
        print(f"Hint {index}/{len(problem.hints)} for {problem.number}: {text}")
    return EXIT_PASS


def cmd_watch(problem, args) -> int:
    """Judge now and after every save, in one warm test process: the first failing property and the score."""
    path, target_args = _target(problem, args)
    tests_root = _tests_root(args)
    config = config_of(args, profile=args.profile or "quick")
    tests = WarmTests(env_for_tests())
    print(f"watching {os.path.relpath(path)}: save it to re-judge; Ctrl-C to stop", flush=True)

    def rejudge():
        print("\n" + "─" * 60, flush=True)
        try:
            _validate(problem, path)
            verdict = judge_once(problem, path, config, tests_root=tests_root, select=args.select, runner=tests)
        except (UsageError, InternalError) as e:   # a syntax error, a missing name: say so, keep watching
            print(f"error: {e}", flush=True)
            return
        report.render_text(verdict, target_args + (["--tests", tests_root] if tests_root else []), brief=True)
        if path == problem.practice_file() and not args.select and not tests_root:
            Progress(KitConfig().state_dir).record_result(problem, verdict.score, verdict.max_score,
                                                          verdict.all_passed)

    try:
        watch(path, rejudge)
    except KeyboardInterrupt:
        print("\nstopped watching")
    finally:
        tests.close()
    return EXIT_PASS


def cmd_trace(problem, args) -> int:
    from rich.text import Text
    path, target_args = _target(problem, args)
    _validate(problem, path)
    tests_root = _tests_root(args)
    if tests_root:
        target_args = target_args + ["--tests", tests_root]
    con = report.console()
    with scratch("trace-") as trace_dir:
        with live(args, f"tracing {problem.number}") as bar:
            verdict = judge_once(problem, path, config_of(args, profile="quick"), tests_root=tests_root,
                                 seed=args.seed, select=args.select, trace_dir=trace_dir,
                                 progress=bar if bar.enabled else None)
        if not verdict.tests:
            raise _no_tests(verdict, args)
        traces = {}
        for t in verdict.tests:
            file = os.path.join(trace_dir, show.trace_file_name(t.name))
            if os.path.exists(file):
                with open(file, encoding="utf-8") as f:
                    traces[t.name] = json.load(f)
        chosen, chrome = show.pick(problem, verdict, traces)
        report.render_text(verdict, target_args, brief=True)
        if chosen is None:
            con.print(Text(f"nothing to draw: {_why_nothing_to_draw(verdict, args)}", style="yellow"), soft_wrap=True)
            return EXIT_USAGE if args.select and not verdict.failures() else EXIT_FAIL
        state = "failing" if not chosen.passed else "passing"
        con.print()
        con.print(Text(f"timeline of {chosen.name} ({state})" +
                       (f", failing case: {chosen.example}" if not chosen.passed and chosen.example else
                        ", its last traced call"), style="bold"), soft_wrap=True)
        if args.trace:
            shutil.copyfile(os.path.join(trace_dir, show.trace_file_name(chosen.name)), args.trace)
            con.print(f"wrote {args.trace}: open it in https://ui.perfetto.dev or chrome://tracing")
    if args.show:
        text = Text()
        for piece, style in show.render_lanes(chrome):
            text.append(piece, style=style)
        con.print(text)
        drawing = show.drawing(problem, verdict)
        if drawing:
            con.print(Text(drawing))
    return EXIT_PASS if verdict.all_passed else EXIT_FAIL


def _why_nothing_to_draw(verdict, args) -> str:
    stubbed = report.not_implemented_groups(verdict.failures())
    untraced = [t for t in verdict.failures() if t.kind != "not implemented"]
    if untraced:
        return (f"{untraced[0].name} failed inside the ranks ({untraced[0].kind}), so its failing call "
                "left no timeline, and no test passed with one")
    if stubbed:
        return "no test got as far as a multi-rank call: they stop at the stub's NotImplementedError (above)"
    return "no multi-rank call ran in " + ("the tests matching -k " + repr(args.select) if args.select
                                           else "this problem's tests")


def cmd_selfcheck(problems, args) -> int:
    from rich.table import Table
    from rich.text import Text
    chosen = [_problem(problems, n) for n in args.rest] if args.rest else [problems[n] for n in sorted(problems)]
    tests_root = _tests_root(args)
    config = config_of(args, profile=args.profile if args.profile not in (None, "default") else "quick")
    _check_backend(chosen, config)
    rows = []
    for problem in chosen:
        with live(args, f"selfcheck {problem.number}") as bar:
            rows += selfcheck_problem(problem, config, tests_root=tests_root,
                                      seed=args.seed if args.seed is not None else 0,
                                      progress=bar if bar.enabled else None, device_audit=args.device_audit)
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
    from rich.progress import Progress as Bar
    from rich.table import Table
    if len(args.rest) != 2 or not args.out:
        raise UsageError("usage: python judge.py grade <problem> <submissions folder> --out grades.csv")
    problem = _problem(problems, args.rest[0])
    _check_backend([problem], config_of(args))
    tests_root = _tests_root(args)
    seed = args.seed if args.seed is not None else 0   # one seed for the whole class: same cases for everyone
    count = len(find_submissions(args.rest[1], problem))
    con = report.console()
    with Bar(console=con, transient=not con.is_terminal) as bar:
        task = bar.add_task(f"grading {count} submissions for {problem.number}", total=count)
        results = grade(problem, args.rest[1], args.out, config_of(args), seed=seed, tests_root=tests_root,
                        jobs=args.jobs, timeout=args.timeout, progress=lambda r: bar.advance(task))
    table = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("student", "score", "status"):
        table.add_column(col, overflow="fold")
    for r in results:
        max_score = r.get("max_score")
        table.add_row(r["student"], f"{r['score']:g}/{max_score:g}" if max_score else f"{r['score']:g}", r["status"])
    con.print(table)
    summary = common_failures(results)
    if summary:
        con.print("most common failing properties:")
        for s in summary:
            con.print(f"  {s['students']} × {s['test']} ({s['kind']}): {s['example']}")
    con.print(f"wrote {args.out} and {os.path.splitext(args.out)[0]}.json")
    return EXIT_PASS
