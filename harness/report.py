"""How a verdict is shown: rich text for people, JSON for tools, Gradescope's results.json for autograders.

Text degrades to plain lines without a TTY and honours NO_COLOR (rich does both).
"""
from __future__ import annotations

import json
import os
import shlex
import sys

from .judging import Verdict


def console(stream=None):
    from rich.console import Console
    stream = stream or sys.stdout
    return Console(file=stream, highlight=False, soft_wrap=False,
                   width=None if stream.isatty() else 100)


def _relative(path: str) -> str:
    rel = os.path.relpath(path) if path else path
    return path if not path or rel.startswith("..") else rel


def replay_command(verdict: Verdict, test_name: str, target_args: list) -> str:
    args = ["python", "judge.py", str(verdict.problem.number), *target_args, "-k", test_name.split("[")[0],
            "--seed", str(verdict.seed), "--profile", verdict.profile]
    return " ".join(shlex.quote(a) for a in args)


def render_text(verdict: Verdict, target_args: list, out=None, brief: bool = False):
    from rich.table import Table
    from rich.text import Text
    con = console(out)
    p = verdict.problem
    if not brief:
        con.print(Text(f"{p.number} · {p.display_title}", style="bold"))
        con.print(Text(f"target: {_relative(verdict.target)}   profile: {verdict.profile}   seed: {verdict.seed}",
                       style="dim"))
        table = Table(show_edge=False, box=None, pad_edge=False)
        table.add_column("test")
        table.add_column("points", justify="right")
        table.add_column("result")
        table.add_column("time", justify="right")
        for t in verdict.tests:
            result = Text("pass", style="green") if t.passed else Text(t.kind or "fail", style="red")
            table.add_row(t.name, f"{t.points:g}/{t.max_points:g}", result, f"{t.duration:.1f}s")
        con.print(table)
    style = "bold green" if verdict.all_passed else "bold red"
    con.print(Text(f"score: {verdict.score:g}/{verdict.max_score:g}   ({verdict.elapsed:.1f} s)", style=style))
    failures = verdict.failures()
    for t in failures[:1] if brief else failures:
        con.print()
        con.print(Text(f"✗ {t.name}", style="bold red"))
        con.print(Text(_indent(t.message or "(no message)")))
        if t.example and t.kind != "not implemented":
            con.print(Text(_indent(t.example), style="yellow"))
        if t.kind != "not implemented":
            con.print(Text("  rerun just this case: " + replay_command(verdict, t.name, target_args), style="dim"))
    if verdict.all_passed and not brief:
        con.print(Text("All properties hold. Next: python judge.py", style="green"))


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def as_json(verdict: Verdict) -> dict:
    return {
        "problem": verdict.problem.number, "title": verdict.problem.title, "target": verdict.target,
        "score": verdict.score, "max_score": verdict.max_score, "passed": verdict.all_passed,
        "seed": verdict.seed, "profile": verdict.profile, "execution_time": round(verdict.elapsed, 3),
        "tests": [{"name": t.name, "outcome": t.outcome, "score": t.points, "max_score": t.max_points,
                   "kind": t.kind, "message": t.message, "example": t.example,
                   "duration": round(t.duration, 3)} for t in verdict.tests],
    }


def as_gradescope(verdict: Verdict, visibility: str = "visible") -> dict:
    """Gradescope autograder results.json (score, max_score, tests[], execution_time)."""
    tests = []
    for t in verdict.tests:
        output = "" if t.passed else "\n\n".join(x for x in (t.message, t.example) if x)
        tests.append({"name": t.name, "score": t.points, "max_score": t.max_points,
                      "status": "passed" if t.passed else "failed", "output": output, "visibility": visibility})
    return {"score": verdict.score, "max_score": verdict.max_score, "execution_time": round(verdict.elapsed, 3),
            "output": f"Problem {verdict.problem.number}: {verdict.problem.title}", "visibility": visibility,
            "tests": tests}


def write(verdict: Verdict, fmt: str, output: str | None, target_args: list):
    if fmt == "text":
        if output:
            with open(output, "w", encoding="utf-8") as f:
                render_text(verdict, target_args, out=f)
        else:
            render_text(verdict, target_args)
        return
    data = as_json(verdict) if fmt == "json" else as_gradescope(verdict)
    text = json.dumps(data, indent=2, ensure_ascii=False)
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)
