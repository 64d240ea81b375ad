"""judge.py's commands: parse the command line into a ``KitConfig`` and a command, run it, map errors to exit codes."""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import time

from . import catalogue, report, scaffold, show, stubs
from .config import LANGS, PROFILES, KitConfig, language
from .messages import Message, speaker
from harness import protections_here

from .channel import scratch
from .grade import common_failures, find_submissions, grade
from .judging import InternalError, JudgeStopped, UsageError, env_for_tests, judge_once
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
    p.add_argument("problem", nargs="?", help="problem number, or 'selfcheck' / 'grade' / 'new' / 'doctor'")
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--solution", action="store_true", help="judge the reference in solutions/")
    which.add_argument("--target", metavar="FILE", help="judge this file instead of practice/")
    p.add_argument("--tests", metavar="DIR", help="judge against this test set laid out like practice/ "
                                                  "(e.g. hidden tests) instead of the public tests")
    p.add_argument("--add-tests", metavar="DIR", help="judge against the public tests and this test set too")
    p.add_argument("--visibility", choices=report.VISIBILITIES, default="after_published",
                   help="gradescope: when students see the tests of --tests / --add-tests (default "
                        "after_published; the public tests are always visible)")
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
    p.add_argument("--jobs", type=_at_least_one, help="grade: submissions judged in parallel (default: CPU cores)")
    p.add_argument("--timeout", type=_positive, default=600, help="grade: seconds per submission")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="grade: judge each submission as a task on this Ray cluster (its address, or auto); "
                        "needs pip install -e '.[ray]'")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="also show hypothesis's own output under each failure")
    p.add_argument("--no-landlock", action="store_true",
                   help="confine the ranks as on a kernel without Landlock (see what the fallback alone does)")
    p.add_argument("--sealed", action="store_true",
                   help="refuse to grade unless every protection is in force (Landlock, seccomp, the ranks' own "
                        "uid when root, the file witness): a verdict a cheater cannot have forged")
    p.add_argument("--device-audit", action="store_true",
                   help="selfcheck: the reference also runs under the device audit (tensors on harness.device())")
    p.add_argument("--skip-reference", action="store_true",
                   help="selfcheck: leave the reference out (pytest --solution judges it, under the device audit)")
    p.add_argument("--title", help="new: the new problem's title")
    p.add_argument("--topic", default="model parallel", help="new: the new problem's topic")
    p.add_argument("--lang", choices=list(LANGS), default=None,
                   help="the language of the report, hints and messages: en or zh (default: KIT_LANG, else the "
                        "locale)")
    p.add_argument("--brief", action="store_true", help=argparse.SUPPRESS)
    return p


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def config_of(args, profile: str | None = None) -> KitConfig:
    """The run's configuration: the command line first, then the user's overrides (kit/config.py)."""
    base = KitConfig()
    return KitConfig(profile=profile or args.profile or base.profile, verbose=args.verbose,
                     backend=args.backend or base.backend, landlock=not args.no_landlock,
                     lang=getattr(args, "lang", None) or base.lang)


def _said(error: Exception, lang: str) -> str:
    """A usage error's one line, in ``lang`` where it is a catalogued message."""
    message = error.args[0] if error.args else ""
    text = message.say(lang) if isinstance(message, Message) else str(error)
    return speaker(lang)("usage.error", message=text)


def main(doc: str, argv=None) -> int:
    lang = language()   # what a usage error before the configuration is built is said in
    try:
        args = parser(doc).parse_args(argv)
        lang = config_of(args).lang   # a bad KIT_* override is a usage error too
    except (UsageError, ValueError) as e:
        print(_said(e, lang if lang in LANGS else "en"), file=sys.stderr)
        return EXIT_USAGE
    try:
        problems = catalogue.load()
    except catalogue.CatalogueError as e:
        print(f"problems.yaml: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _sigterm_as_interrupt():
            return _dispatch(problems, args)
    except UsageError as e:
        print(_said(e, lang), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\n" + speaker(lang)("usage.interrupted"), file=sys.stderr)
        return EXIT_INTERRUPTED
    except InternalError as e:
        print(f"internal error: {e}", file=sys.stderr)
        return EXIT_INTERNAL


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM (what ``timeout`` and Gradescope send) ends a run as Ctrl-C does: the judges it started
    are ended, what there is gets written, and the exit code says "interrupted" (2)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:   # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _dispatch(problems, args) -> int:
    if args.problem == "doctor":   # before --sealed's refusal: doctor is how one finds out what is missing
        if args.rest:
            raise UsageError(Message("usage.unexpected", {"args": " ".join(args.rest)}))
        from .doctor import doctor   # only here: it probes the machine
        return doctor(problems, config_of(args))
    if args.sealed:
        _require_sealing(protections_here())
    if args.problem is None:
        return cmd_list(problems, config_of(args).lang)
    if args.problem == "selfcheck":
        return cmd_selfcheck(problems, args)
    if args.problem == "grade":
        return cmd_grade(problems, args)
    if args.problem == "new":
        return cmd_new(args)
    if args.rest:
        raise UsageError(Message("usage.unexpected", {"args": " ".join(args.rest)}))
    for option in ("output", "trace"):
        _writable(getattr(args, option), f"--{option}")
    problem = _problem(problems, args.problem)
    _check_backend([problem], config_of(args))
    if args.hint:
        return cmd_hint(problem, config_of(args).lang)
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
        raise UsageError(Message("usage.no_problem", {"text": text, "valid": valid}))
    return problems[int(text)]


def _writable(path: str | None, option: str):
    """A file to write: its folder must exist (one line and exit 4, not a traceback)."""
    folder = os.path.dirname(os.path.abspath(path)) if path else None
    if folder and not os.path.isdir(folder):
        raise UsageError(Message("usage.no_folder", {"option": option, "path": path, "folder": folder}))
    if path and os.path.isdir(path):
        raise UsageError(Message("usage.is_folder", {"option": option, "path": path}))


def _target(problem, args, scored: bool = False) -> tuple[str, list]:
    """(path, the judge.py arguments that select it again, for replay commands).  ``scored`` (json,
    gradescope): a missing file is judged anyway, so the report has its score, 0, and the reason."""
    if args.solution:
        return problem.solution_file(), ["--solution"]
    if args.target:
        path = os.path.abspath(args.target)
        if os.path.isdir(path) and not scored:
            inside = os.path.join(args.target, problem.file)
            more = Message("usage.did_you_mean", {"inside": inside}) if os.path.isfile(inside) else \
                Message("usage.file_is", {"number": problem.number, "file": problem.file})
            raise UsageError(_TargetFolder(args.target, more))
        if not os.path.isfile(path) and not scored:
            raise UsageError(Message("usage.target_missing", {"target": args.target}))
        return path, ["--target", args.target]
    return problem.practice_file(), []


def missing_submission(problem, path: str) -> str:
    """Why a submission scores 0 before any test runs: no such file, and what the upload holds instead."""
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        return f"No submission: {path} is a folder. Submit the file {problem.file}."
    if not os.path.isdir(folder):
        return f"No submission: {path} does not exist. Submit the file {problem.file}."
    held = sorted(os.listdir(folder))
    return (f"No submission: there is no {os.path.basename(path)} in what was submitted "
            + (f"({', '.join(held[:10])}{', …' if len(held) > 10 else ''})" if held else "(nothing)")
            + f". Submit the file {problem.file}, named exactly so; every test scores 0.")


def _validate(problem, path, scored: bool = False):
    """A file that cannot be used is a usage error in plain words.  ``scored`` (json, gradescope):
    a file that fails to load, or is missing, is judged anyway, every test failing with "load error",
    so the report still has its score, its maximum and the reason."""
    from harness import Target, TargetError
    try:
        Target(path, problem.names).validate()
    except TargetError as e:
        if not scored:
            raise UsageError(str(e)) from None


def _tests_root(args) -> str | None:
    for option, folder in (("--tests", args.tests), ("--add-tests", args.add_tests)):
        if folder and not os.path.isdir(folder):
            raise UsageError(Message("usage.tests_missing", {"option": option, "folder": folder}))
    return args.tests


def _test_set_args(args) -> list:
    """The judge.py arguments that select this run's test sets again (for rerun commands)."""
    return (["--tests", args.tests] if args.tests else []) + (["--add-tests", args.add_tests] if args.add_tests else [])


class _TargetFolder(Message):
    """--target names a folder: said with the file it may have meant, in the message's language."""

    def __init__(self, target: str, more: Message):
        super().__init__("usage.target_folder", {"target": target, "more": more})

    def say(self, lang: str) -> str:
        return speaker(lang)(self.id, target=self.fields["target"], more=self.fields["more"].say(lang))


def _no_tests(verdict, args) -> UsageError:
    return UsageError(_NoTests(verdict.tests_dir, args.select))


class _NoTests(Message):
    def __init__(self, folder: str, select: str | None):
        super().__init__("usage.no_tests", {"folder": folder, "select": select})

    def say(self, lang: str) -> str:
        say = speaker(lang)
        return say(self.id, folder=self.fields["folder"],
                   select=say("usage.for_select", select=self.fields["select"]) if self.fields["select"] else "")


def cmd_judge(problem, args) -> int:
    scored = args.format != "text"
    path, target_args = _target(problem, args, scored=scored)
    _validate(problem, path, scored=scored)
    tests_root = _tests_root(args)
    with live(args, f"judging {problem.number}") as bar:
        verdict = judge_once(problem, path, config_of(args), tests_root=tests_root, add_tests=args.add_tests,
                             seed=args.seed, select=args.select, progress=bar if bar.enabled else None)
    if not verdict.tests:
        raise _no_tests(verdict, args)
    if args.sealed and not verdict.protections.get("sealed"):
        raise InternalError("--sealed: the ranks of this run were not sealed in: "
                            + "; ".join(verdict.protections.get("missing") or ["no rank reported"]))
    target_args = target_args + _test_set_args(args)
    lang = config_of(args).lang
    if args.format == "text" and not args.output:
        report.render_text(verdict, target_args, brief=args.brief, verbose=args.verbose, select=args.select,
                           lang=lang)
    else:
        report.write(verdict, args.format, args.output, target_args, verbose=args.verbose,
                     hidden_visibility=args.visibility,
                     note="" if os.path.isfile(path) else missing_submission(problem, path), lang=lang)
    # Progress is the score of a complete run of the learner's own file on the public tests.
    if path == problem.practice_file() and not args.select and not tests_root and not args.add_tests:
        Progress(KitConfig().state_dir).record_result(problem, verdict.score, verdict.max_score, verdict.all_passed)
    return EXIT_PASS if verdict.all_passed else EXIT_FAIL


def _status_words(status: str, say) -> str:
    """A problem's status (``progress.status_of``) in the report's language."""
    if status.startswith("failing"):
        return say("status.failing", score=status[status.index("(") + 1:-1])
    return say(f"status.{status}")


def cmd_list(problems, lang: str = "en") -> int:
    from rich.table import Table
    from rich.text import Text
    say = speaker(lang)
    con = report.console()
    state = Progress(KitConfig().state_dir).load()
    table = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("number", "problem", "difficulty", "topic", "status"):
        table.add_column(say(f"list.col.{col}"), overflow="fold")
    for n in sorted(problems):
        p = problems[n]
        status = status_of(p, state)
        style = "green" if status == "passed" else "yellow" if status.startswith("failing") else "dim"
        table.add_row(str(n), p.title_in(lang), say(f"difficulty.{p.difficulty}"), say(f"topic.{p.topic}"),
                      Text(_status_words(status, say), style=style))
    con.print(table)
    nxt = next_problem(problems, state)
    if nxt is None:
        con.print(Text(say("list.all_pass"), style="green"))
    else:
        con.print(Text(say("list.next", folder=nxt.folder, readme=nxt.readme(lang), number=nxt.number), style="bold"))
    return EXIT_PASS


def cmd_hint(problem, lang: str = "en") -> int:
    say = speaker(lang)
    index, text = Progress(KitConfig().state_dir).next_hint(problem)
    hints = problem.hints_in(lang)
    if text is None:
        print(say("hint.none_left", number=problem.number, count=len(hints), folder=problem.folder,
                  readme=problem.readme(lang)))
    else:
        print(say("hint", index=index, count=len(hints), number=problem.number, text=hints[index - 1]))
    return EXIT_PASS


def cmd_watch(problem, args) -> int:
    """Judge now and after every save, in one warm test process: the first failing property and the score.

    Each judge sees a copy of the file as saved (kit.watch), and a newer save abandons it for the newer one.
    """
    path, target_args = _target(problem, args)
    tests_root = _tests_root(args)
    config = config_of(args, profile=args.profile or "quick")
    tests = WarmTests(env_for_tests())
    print(f"watching {os.path.relpath(path)}: save it to re-judge; Ctrl-C to stop", flush=True)

    def rejudge(copy: str, stop):
        print("\n" + "─" * 60 + f"\njudging your save of {time.strftime('%H:%M:%S')} …", flush=True)
        try:
            _validate(problem, copy)
            verdict = judge_once(problem, copy, config, tests_root=tests_root, add_tests=args.add_tests,
                                 select=args.select, runner=functools.partial(tests, stop=stop))
        except JudgeStopped:
            return   # a newer save (or Ctrl-C): watch says which
        except (UsageError, InternalError) as e:   # a syntax error, a missing name: say so, keep watching
            print(f"error: {str(e).replace(copy, path)}", flush=True)
            return
        report.render_text(_as_saved(verdict, copy, path), target_args + _test_set_args(args), brief=True)
        if path == problem.practice_file() and not args.select and not tests_root and not args.add_tests:
            Progress(KitConfig().state_dir).record_result(problem, verdict.score, verdict.max_score,
                                                          verdict.all_passed)

    try:
        watch(path, rejudge, superseded=lambda: print("a newer save arrived: judging that one instead", flush=True))
    except KeyboardInterrupt:
        print("\nstopped watching")
    finally:
        tests.close()
    return EXIT_PASS


def _as_saved(verdict, copy: str, path: str):
    """The verdict of ``copy`` told about ``path``: the file the learner saved, not watch's copy of it."""
    verdict.target = path
    for t in verdict.tests:
        t.message, t.example, t.hypothesis = (x.replace(copy, path) for x in (t.message, t.example, t.hypothesis))
        if t.location:
            t.location = [t.location[0].replace(copy, path), *t.location[1:]]
    return verdict


def cmd_trace(problem, args) -> int:
    from rich.text import Text
    path, target_args = _target(problem, args)
    _validate(problem, path)
    tests_root = _tests_root(args)
    target_args = target_args + _test_set_args(args)
    con = report.console()
    with scratch("trace-") as trace_dir:
        with live(args, f"tracing {problem.number}") as bar:
            verdict = judge_once(problem, path, config_of(args, profile="quick"), tests_root=tests_root,
                                 add_tests=args.add_tests, seed=args.seed, select=args.select, trace_dir=trace_dir,
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
        page = show.write_html(problem, chosen, chrome, KitConfig().state_dir)
        con.print(f"wrote {report.relative(page)}: the same timeline as a picture (open it in a browser)",
                  soft_wrap=True)
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
    # the catalogue against the files it names: a renamed test, a stale README table, a statement's list
    rows = [{"problem": "all", "target": "catalogue", "ok": False, "detail": line}
            for line in scaffold.out_of_sync(problems, only=[p.number for p in chosen] if args.rest else None)] \
        if tests_root is None else []
    for problem in chosen:
        with live(args, f"selfcheck {problem.number}") as bar:
            rows += selfcheck_problem(problem, config, tests_root=tests_root,
                                      seed=args.seed if args.seed is not None else 0,
                                      progress=bar if bar.enabled else None, device_audit=args.device_audit,
                                      reference=not args.skip_reference)
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        con = report.console()
        table = Table(show_edge=False, pad_edge=False, box=None)
        for col in ("problem", "target", "", "detail"):
            table.add_column(col, overflow="fold")
        for r in rows:
            verdict = (Text("skip", style="yellow") if r.get("skipped") else
                       Text("info", style="cyan") if r.get("info") else
                       Text("ok", style="green") if r["ok"] else Text("SURPRISE", style="bold red"))
            table.add_row(str(r["problem"]), r["target"], verdict, r["detail"])
        con.print(table)
        bad = [r for r in rows if not r["ok"]]
        checks = [r for r in rows if not r.get("info")]
        con.print(Text(f"{len(checks) - len(bad)} of {len(checks)} checks as expected",
                       style="red" if bad else "green"))
        if tests_root:
            con.print(Text(selfcheck_summary(tests_root, rows), style="red" if bad else "green"))
    return EXIT_FAIL if any(not r["ok"] for r in rows) else EXIT_PASS


def cmd_new(args) -> int:
    """judge.py new N SLUG [--title T] [--topic T]: lay out a new problem (kit/scaffold.py)."""
    if len(args.rest) != 2 or not args.rest[0].isdigit():
        raise UsageError("usage: python judge.py new <number> <slug> [--title TITLE] [--topic TOPIC]")
    try:
        written = scaffold.new(int(args.rest[0]), args.rest[1], title=args.title or "", topic=args.topic)
    except scaffold.ScaffoldError as e:
        raise UsageError(str(e)) from None
    print("\n".join(["wrote:"] + [f"  {path}" for path in written] +
                     [f"next: write the problem over the skeleton, add two alternates in {written[-1]}, then run "
                      f"python judge.py selfcheck {args.rest[0]}"]))
    return EXIT_PASS


def selfcheck_summary(tests_root: str, rows: list) -> str:
    """What selfcheck --tests says of an instructor's test set as a whole."""
    if any(not r["ok"] for r in rows):
        return f"the test set in {tests_root} is NOT valid: see the SURPRISE rows"
    info = [r for r in rows if r.get("info")]
    return (f"the test set in {tests_root} is valid: every reference passes it and every stub fails it cleanly"
            + (f" ({len(info)} known-wrong versions run on it, shown for information)" if info else ""))


def _grade_args(problems, args):
    if len(args.rest) != 2 or not args.out:
        raise UsageError("usage: python judge.py grade <problem> <submissions folder> --out grades.csv")
    problem = _problem(problems, args.rest[0])
    _writable(args.out, "--out")
    if not args.ray:   # on a Ray cluster the nodes' GPUs count, not this machine's (kit.ray_grade checks them)
        _check_backend([problem], config_of(args))
    return problem, _tests_root(args)


def cmd_grade(problems, args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn
    from rich.table import Table
    problem, tests_root = _grade_args(problems, args)
    seed = args.seed if args.seed is not None else 0   # one seed for the whole class: same cases for everyone
    submissions, skipped = find_submissions(args.rest[1], problem)
    con = report.console()
    for s in skipped:
        con.print(f"skipped {s['entry']}: {s['why']}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tests"),
               TimeElapsedColumn())
    with Bar(*columns, console=con, transient=True, disable=not con.is_terminal) as bar:
        task = bar.add_task(f"grading {len(submissions)} submissions for {problem.number}", total=None)
        tests = GradeProgress(bar, task, len(submissions))

        def done(row):
            tests.finished(row["student"])
            bar.console.print(f"graded {row['student']}: {_score(row)} ({row['status']}) in {row['elapsed']:.1f} s")
        book = grade(problem, submissions, skipped, args.out, config_of(args), seed=seed, tests_root=tests_root,
                     add_tests=args.add_tests, select=args.select, jobs=args.jobs, timeout=args.timeout,
                     progress=tests.event, done=done, ray=args.ray)
    table = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("student", "score", "status", "reason"):
        table.add_column(col, overflow="fold")
    for r in book.results:
        table.add_row(r["student"], _score(r), r["status"], r["error"].splitlines()[0] if r["error"] else "")
    con.print(table)
    summary = common_failures(book.results)
    if summary:
        con.print("most common failing properties:")
        for s in summary:
            con.print(f"  {s['students']} × {s['test']} ({s['kind']}): {s['example']}")
    json_out = os.path.splitext(args.out)[0] + ".json"
    if book.interrupted:
        unfinished = sum(r["status"] == "interrupted" for r in book.results)
        con.print(f"interrupted: wrote {args.out} and {json_out}, with {len(book.results) - unfinished} of "
                  f"{len(book.results)} students judged and {unfinished} marked interrupted")
        return EXIT_INTERRUPTED
    con.print(f"wrote {args.out} and {json_out}" + (f" ({len(skipped)} entries skipped, listed above)" if skipped
                                                     else ""))
    return EXIT_PASS


def _score(row) -> str:
    if row["score"] is None:
        return "-"
    return f"{row['score']:g}/{row['max_score']:g}" if row.get("max_score") else f"{row['score']:g}"


class GradeProgress:
    """The grade bar counts tests, not students: it moves as each judge finishes a test."""

    def __init__(self, bar, task, students: int):
        self.bar, self.task, self.students = bar, task, students
        self.collected, self.ended = {}, {}

    def event(self, student: str, event: dict):
        kind = event.get("event")
        if kind == "collected":
            self.collected[student] = event.get("count") or 0
            # until every judge has collected, assume the others have as many tests as this one
            self.bar.update(self.task, total=self.students * max(self.collected.values()))
        elif kind == "end":
            self.ended[student] = self.ended.get(student, 0) + 1
            self.bar.advance(self.task)

    def finished(self, student: str):
        """A judge that ended early (a timeout, a load error) still counts its tests as done."""
        left = self.collected.get(student, 0) - self.ended.get(student, 0)
        if left > 0:
            self.bar.advance(self.task, left)
