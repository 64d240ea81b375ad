"""How a verdict is shown: rich text for people, JSON for tools, Gradescope's results.json for autograders.

Text degrades to plain lines without a TTY and honours NO_COLOR (rich does both).  A failure
reads the same everywhere (judge.py, plain ``pytest practice/``): the broken property, the case
that broke it, and one command that reruns just that case.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys

from .judging import NOT_IMPLEMENTED, Verdict
from . import messages
from .messages import speaker
from . import statements

LOAD_ERROR = "load error"   # the kind of every test of a file that could not be loaded


def console(stream=None):
    """A terminal gets rich's layout at its width; a pipe or a file gets whole lines, never wrapped
    (a line cut at some column breaks grep, logs and pasted commands)."""
    from rich.console import Console
    stream = stream or sys.stdout
    tty = stream.isatty()
    return Console(file=stream, highlight=False, soft_wrap=not tty, width=None if tty else 100)


def relative(path: str) -> str:
    """Relative to the working directory when inside it; any other path whole."""
    rel = os.path.relpath(path) if path else path
    return path if not path or rel.startswith("..") else rel


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/(?:[^\s/:'\"(),\[\]]+/)+([^\s/:'\"(),\[\]]+)")


def strip_paths(text: str) -> str:
    """Absolute paths reduced to their file names: what a grading server's layout is no one's business."""
    return _ABSOLUTE_PATH.sub(lambda m: m.group(1), text or "")


def replay_command(verdict_or_number, test_name: str, target_args: list, seed=None, profile=None) -> str:
    """The one pasteable command that reruns just this test with the same cases."""
    if isinstance(verdict_or_number, Verdict):
        number, seed, profile = verdict_or_number.problem.number, verdict_or_number.seed, verdict_or_number.profile
    else:
        number = verdict_or_number
    args = ["python", "judge.py", str(number), *target_args, "-k", test_name.split("[")[0],
            "--seed", str(seed), "--profile", str(profile)]
    return " ".join(shlex.quote(str(a)) for a in args)


def not_implemented_groups(tests) -> list[tuple[str, list]]:
    """[(location, [test names])] for tests still stopped by the stub's own NotImplementedError."""
    groups: dict[str, list] = {}
    for t in tests:
        if _kind(t) == NOT_IMPLEMENTED:
            where = _location_text(t)
            groups.setdefault(where, []).append(_name(t))
    return sorted(groups.items(), key=lambda kv: _line_of(kv[0]))


def _kind(t):
    return t.get("kind") if isinstance(t, dict) else t.kind


def _name(t):
    return t.get("name") if isinstance(t, dict) else t.name


def _location_text(t) -> str:
    loc = t.get("location") if isinstance(t, dict) else t.location
    if loc:
        file, line, func = loc
        return f"{relative(file)}:{line} ({func})"
    message = t.get("message", "") if isinstance(t, dict) else t.message
    return message.removeprefix("not implemented yet: ")


def _line_of(location: str) -> int:
    m = re.search(r":(\d+)", location)
    return int(m.group(1)) if m else 0


def failure_lines(name: str, kind: str | None, message: str, case: str, rerun: str | None,
                  max_message_lines: int | None = None, lang: str = "en", explained: str = "") -> list[tuple[str, str]]:
    """(text, style) lines of one failure: the property (``explained``: the statement's words for it, in
    ``lang``), the message, the case that broke it, the rerun command."""
    say = speaker(lang)
    lines = [(f"✗ {name}" + (f" ({kind_words(kind, lang)})" if kind and kind not in ("property",) else ""),
              "bold red")]
    if explained:
        lines.append(("  " + say("report.property", text=explained), "bold"))
    body = (message or say("report.no_message")).splitlines()
    if max_message_lines and len(body) > max_message_lines:
        hidden = len(body) - max_message_lines
        more = say("report.more_lines", count=hidden)
        body = body[:max_message_lines] + [more.replace("lines", "line") if hidden == 1 else more]
    lines += [("  " + line, "") for line in body]
    if case:
        lines.append(("  " + say("report.case", case=case), "yellow"))
    if rerun:
        lines.append(("  " + say("report.rerun", command=rerun), "dim"))
    return lines


def kind_words(kind: str | None, lang: str) -> str | None:
    """A failure's kind in ``lang`` (a kind without a message of its own is said as it is)."""
    return messages.say(lang, f"kind.{kind}") if kind and f"kind.{kind}" in messages.MESSAGES else kind


def explanation(verdict: Verdict, test_name: str, lang: str) -> str:
    """The statement's words for a failed property, where they are not the report's own language already: the
    Chinese statement's property list under ``--lang zh``; nothing in English (the message is English)."""
    return "" if lang == "en" else statements.property_text(verdict.problem, test_name.split("[")[0], lang)


def load_error_groups(tests) -> list[tuple[str, list]]:
    """[(message, [test names])] for tests that could not load the file under test: one reason, said once."""
    groups: dict[str, list] = {}
    for t in tests:
        if _kind(t) == LOAD_ERROR:
            groups.setdefault(t.get("message", "") if isinstance(t, dict) else t.message, []).append(_name(t))
    return list(groups.items())


def render_text(verdict: Verdict, target_args: list, out=None, brief: bool = False, verbose: bool = False,
                select: str | None = None, lang: str = "en"):
    from rich.table import Table
    from rich.text import Text
    con = console(out)
    say = speaker(lang)
    p = verdict.problem
    if not brief:
        con.print(Text(f"{p.number} · {p.title_in(lang)}", style="bold"))
        con.print(Text(say("report.run", target=relative(verdict.target), profile=verdict.profile, seed=verdict.seed,
                           backend=verdict.backend), style="dim"))
        line, line_style = protections_line(verdict.protections, lang)
        con.print(Text(line, style=line_style), soft_wrap=True)
        table = Table(show_edge=False, box=None, pad_edge=False)
        table.add_column(say("report.col.test"), overflow="fold")
        table.add_column(say("report.col.points"), justify="right")
        table.add_column(say("report.col.result"))
        table.add_column(say("report.col.time"), justify="right")
        for t in verdict.tests:
            result = Text(say("report.pass"), style="green") if t.passed else \
                Text(kind_words(t.kind, lang) or say("report.fail"), style="red")
            table.add_row(t.name, f"{t.points:g}/{t.max_points:g}", result, f"{t.duration:.1f}s")
        con.print(table)
    style = "bold green" if verdict.all_passed else "bold red"
    con.print(Text(say("report.score", score=f"{verdict.score:g}", max_score=f"{verdict.max_score:g}",
                       seconds=f"{verdict.elapsed:.1f}"), style=style))
    real = [t for t in verdict.failures() if t.kind not in (NOT_IMPLEMENTED, LOAD_ERROR)]
    stubs = not_implemented_groups(verdict.failures())
    for message, names in load_error_groups(verdict.failures()):
        con.print()
        every = say("report.every_test") if len(names) == len(verdict.tests) else \
            say("report.some_tests", count=len(names))
        for line, line_style in failure_lines(say("report.load_error", which=every), None, message, "", None,
                                              lang=lang):
            con.print(Text(line, style=line_style), soft_wrap=True)
    for t in real[:1] if brief else real:
        con.print()
        for line, line_style in failure_lines(t.name, t.kind, t.message, t.example,
                                              replay_command(verdict, t.name, target_args), lang=lang,
                                              explained=explanation(verdict, t.name, lang)):
            # soft_wrap: a long line stays one line, so the rerun command can be pasted
            con.print(Text(line, style=line_style), soft_wrap=True)
        if verbose and t.hypothesis:
            con.print(Text("  " + say("report.hypothesis"), style="dim"))
            con.print(Text("\n".join("    " + x for x in t.hypothesis.splitlines()), style="dim"), soft_wrap=True)
    if stubs and not (brief and real):
        con.print()
        for where, names in stubs:
            tests = ", ".join(names) if len(names) <= 3 else say("report.and_more", first=names[0], count=len(names) - 1)
            con.print(Text(say("report.not_implemented", where=where, tests=tests), style="red"), soft_wrap=True)
    if not brief:
        for t in verdict.tests:
            if t.cost:
                con.print()
                con.print(cost_table(verdict.problem, t, lang))
    if verdict.all_passed and not brief:
        if select:
            command = "python judge.py " + " ".join(shlex.quote(str(a)) for a in [p.number, *target_args])
            con.print(Text(say("report.selected_hold", select=repr(select), command=command), style="green"),
                      soft_wrap=True)
        else:
            con.print(Text(say("report.all_hold"), style="green"), soft_wrap=True)


def cost_table(problem, test, lang: str = "en"):
    """The figures one test recorded (testkit.cost): the closed form, the model's value, yours, the ratio."""
    from rich.table import Table
    from rich.text import Text
    say = speaker(lang)
    table = Table(title=Text(say("cost.title", test=test.name, case=test.cost.get("case", ""))), title_justify="left",
                  show_edge=False, box=None, pad_edge=False)
    for col, justify in (("figure", "left"), ("formula", "left"), ("model", "right"), ("yours", "right"),
                         ("ratio", "right")):
        table.add_column(say(f"cost.col.{col}"), justify=justify)
    for f in test.cost.get("figures", []):
        model, yours = f.get("model"), f.get("yours")
        # plain text: a closed form such as m · (2·L_s − [s = 0]) · a is no rich markup
        table.add_row(Text(str(f.get("figure"))), Text(problem.cost.get(f.get("figure"), "")), _figure(model),
                      _figure(yours), cost_ratio(model, yours))
    return table


def cost_ratio(model, yours) -> str:
    """yours / model, or a dash where that means nothing (a model of 0, a figure that is no number)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (model, yours))
    return f"{yours / model:.2f}" if numbers and model else "—"


def _figure(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def protections_line(protections: dict, lang: str = "en") -> tuple[str, str]:
    """(text, style): whether the ranks were sealed in, and when not, what was missing and why."""
    say = speaker(lang)
    if not protections:
        return say("protections.unknown"), "yellow"
    if protections.get("sealed"):
        shown = ", ".join(f"{m} {v}" for m, v in protections.items() if m not in ("sealed", "missing"))
        return say("protections.sealed", shown=shown), "dim"
    return say("protections.unsealed", missing="; ".join(protections.get("missing") or ["unknown"])), "bold yellow"


def as_json(verdict: Verdict) -> dict:
    return {
        "problem": verdict.problem.number, "title": verdict.problem.title, "target": verdict.target,
        "score": verdict.score, "max_score": verdict.max_score, "passed": verdict.all_passed,
        "seed": verdict.seed, "profile": verdict.profile, "backend": verdict.backend,
        "execution_time": round(verdict.elapsed, 3), "protections": verdict.protections,
        "tests": [{"name": t.name, "outcome": t.outcome, "score": t.points, "max_score": t.max_points,
                   "kind": t.kind, "message": t.message, "example": t.example,
                   "duration": round(t.duration, 3)} for t in verdict.tests],
    }


VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")   # Gradescope's four


def as_gradescope(verdict: Verdict, hidden_visibility: str = "after_published", note: str = "",
                  lang: str = "en") -> dict:
    """Gradescope autograder results.json (score, max_score, tests[], execution_time).

    What a student reads: the broken property and the failing case, with no paths of the
    grading server in it.  The public tests are ``visible``; a test set of the instructor's
    (``--tests`` / ``--add-tests``) gets ``hidden_visibility``, so its cases stay unseen until then.
    ``note``: said above the tests (why a submission scored 0, say).  ``lang``: as judge.py's report.
    """
    say = speaker(lang)
    tests = []
    for t in verdict.tests:
        output = ""
        if not t.passed:
            explained = explanation(verdict, t.name, lang)
            output = (say("report.property", text=explained) + "\n\n" if explained else "") + t.message + \
                ("\n\n" + say("report.case", case=t.example) if t.example else "")
        tests.append({"name": t.name, "score": t.points, "max_score": t.max_points,
                      "status": "passed" if t.passed else "failed", "output": strip_paths(output),
                      "visibility": "visible" if is_public(verdict, t) else hidden_visibility})
    title = say("report.problem", number=verdict.problem.number, title=verdict.problem.title_in(lang))
    sealed = strip_paths(protections_line(verdict.protections, lang)[0])
    return {"score": verdict.score, "max_score": verdict.max_score, "execution_time": round(verdict.elapsed, 3),
            "output": f"{title}\n{sealed}" + (f"\n\n{strip_paths(note)}" if note else ""), "visibility": "visible",
            "tests": tests, "leaderboard": leaderboard(verdict), "extra_data": {"protections": verdict.protections}}


HIGHER_IS_BETTER = {"hidden fraction"}   # every other cost figure is better lower (bytes, messages, the bubble)


def leaderboard(verdict: Verdict) -> list[dict]:
    """Gradescope's leaderboard entries (name, value, order): each cost figure the tests recorded, as yours over
    the model's (1.00 is the model; below it is better) or, for a fraction that is better higher, yours.  The
    figures come from the harness's trace, never from the code's own numbers (testkit.cost)."""
    entries = []
    for t in verdict.tests:
        for f in (t.cost or {}).get("figures", []):
            figure, model, yours = f.get("figure"), f.get("model"), f.get("yours")
            if figure in HIGHER_IS_BETTER and isinstance(yours, (int, float)):
                entries.append({"name": figure, "value": round(float(yours), 4), "order": "desc"})
                continue
            ratio = cost_ratio(model, yours)
            if ratio != "—":
                entries.append({"name": f"{figure} / model", "value": float(ratio), "order": "asc"})
    return list({e["name"]: e for e in entries}.values())   # one entry per figure: the last test's


def is_public(verdict: Verdict, test) -> bool:
    """A test of the kit's public set (practice/), not of an instructor's."""
    public = os.path.join(verdict.problem.tests_dir(), "")
    return os.path.abspath(test.file or verdict.tests_dir).startswith(public)


def write(verdict: Verdict, fmt: str, output: str | None, target_args: list, verbose: bool = False,
          hidden_visibility: str = "after_published", note: str = "", lang: str = "en"):
    if fmt == "text":
        if output:
            with open(output, "w", encoding="utf-8") as f:
                render_text(verdict, target_args, out=f, verbose=verbose, lang=lang)
        else:
            render_text(verdict, target_args, verbose=verbose, lang=lang)
        return
    data = as_json(verdict) if fmt == "json" else as_gradescope(verdict, hidden_visibility, note, lang)
    text = json.dumps(data, indent=2, ensure_ascii=False)
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)


# ---- plain `pytest practice/` ------------------------------------------------------------------

def problem_status(score: float, max_score: float, tests: list) -> str:
    failed = [t for t in tests if t["outcome"] != "passed"]
    if not failed:
        return "passed"
    if all(t.get("kind") == NOT_IMPLEMENTED for t in failed) and len(failed) == len(tests):
        return "not implemented yet"
    return "failing"


def pytest_summary(reports: list, problems: dict, seed, profile: str, target_args: list | None,
                   full: bool = True) -> list[str]:
    """The closing summary of a pytest run over problems' tests, as plain lines.

    ``full``: real failures first (plain words, case, rerun command), then one line per problem
    whose tests stop at the stub's NotImplementedError, then the table.  Otherwise the table only.
    """
    by_problem: dict[int, list] = {}
    for r in reports:
        if r.get("problem") is not None and r["outcome"] != "skipped":
            by_problem.setdefault(r["problem"], []).append(r)
    lines = []
    if full:
        for number in sorted(by_problem):
            slug = problems[number].slug if number in problems else ""
            for message, _ in load_error_groups(by_problem[number]):   # one file, one reason: said once
                lines += [text for text, _ in failure_lines(f"{number} {slug}: cannot load the file under test",
                                                             None, message, "", None)]
                lines.append("")
            for r in by_problem[number]:
                if r["outcome"] == "passed" or r.get("kind") in (NOT_IMPLEMENTED, LOAD_ERROR):
                    continue
                rerun = replay_command(number, r["name"], target_args, seed, profile) if target_args is not None \
                    else None
                lines += [text for text, _ in failure_lines(f"{number} {r['name']}", r.get("kind"), r["message"],
                                                             r.get("example", ""), rerun, max_message_lines=12)]
                lines.append("")
        for number in sorted(by_problem):
            tests = by_problem[number]
            groups = not_implemented_groups(tests)
            if not groups:
                continue
            slug = problems[number].slug if number in problems else ""
            first = groups[0][0]
            stub_count = sum(len(names) for _, names in groups)
            if stub_count == len(tests):
                lines.append(f"{number} {slug}: not implemented yet ({_short_location(first)})")
            else:
                where = ", ".join(_short_location(w) for w, _ in groups)
                lines.append(f"{number} {slug}: {stub_count} of {len(tests)} tests not implemented yet ({where})")
        if lines:
            lines.append("")
    rows = []
    for number in sorted(by_problem):
        tests = by_problem[number]
        score = sum(float(t["points"]) for t in tests if t["outcome"] == "passed")
        max_score = sum(float(t["points"]) for t in tests)
        title = problems[number].slug if number in problems else ""
        rows.append((str(number), title, problem_status(score, max_score, tests), f"{score:g}/{max_score:g}"))
    header = ("#", "problem", "status", "score")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if full:
        lines.append(f"seed {seed}, profile {profile}. Full pytest output: add -v or --tb=long. "
                     "One problem: python judge.py <number>")
    return lines


def _short_location(location: str) -> str:
    """'practice/113_ddp_buckets/ddp_buckets.py:24 (make_buckets)' -> 'ddp_buckets.py:24'."""
    head = location.split(" (")[0]
    return os.path.basename(head)
