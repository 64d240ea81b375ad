"""Notebook mode: the kit inside Jupyter, as an IPython extension (``%load_ext kit.notebook``).

    %%ranks 4 [--rank R] [--backend gloo|nccl|auto] [--timeout S] [--no-timeline]
                      run the cell on 4 warm ranks (``harness.run``); each rank keeps its own namespace
    %ranks_reset      stop every rank (``harness.shutdown``): the next ``%%ranks`` cell starts fresh ones
    %judge N [--profile P] [--seed S] [-k EXPR] [--backend B] [--lang L] [--target FILE]
                      judge problem N's practice file (or FILE): the score table and the first failure
    %%judge N [same options]
                      judge the cell's code as the submission (written to a temporary file, removed after)
    python -m kit.notebook make N [N ...]   notebooks/<number>_<slug>.ipynb, made from the statement

**A namespace per rank.**  The harness keeps a world's ranks alive between calls, so a ``%%ranks`` cell is one
``harness.run`` of ``_run_on_rank`` with the cell's source: on first use a rank makes a module of its own,
kept in its ``sys.modules``, and every later cell runs in that module's ``__dict__`` (like nbdistributed's
persistent workers, each with its own namespace, here without a second process pool).  It starts with
``torch``, ``dist``, ``rank``, ``world_size``, ``device`` (``harness.device()``) and ``phase``
(``harness.phase``, for the timeline).  The worlds are the harness's: one per (size, backend), so
``%%ranks 2`` and ``%%ranks 4`` have namespaces of their own.  A failure that can leave an op in flight
(a hang, a crash, an error on one rank while another waits) makes the harness replace that world: the cell
says so, and the next one starts on empty namespaces.

What each rank prints goes to its own file in a ``harness.SharedFolder`` as well as back with its reply, so a
cell that hangs or raises still shows what every rank printed before.  Tracebacks and hang reports name the
cell's lines: each cell is written to a file ``cell<N>.py`` in a private temporary folder first.
The engine is used through its public API only; the judge through ``judge_once`` and ``render_text``.
"""
from __future__ import annotations

import argparse
import ast
import atexit
import contextlib
import dataclasses
import html
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time

import harness

from . import catalogue
from .config import ROOT, KitConfig
from .judging import judge_once

_NAMESPACE = "__kit_notebook_rank__"     # the module that holds a rank's namespace, in the rank's sys.modules
_DEFAULT_TIMEOUT = 5.0                   # seconds a %%ranks cell may run before it is a hang
_SCOPE = "kit-nb"                        # the CSS class every piece of HTML this module shows lives under
_CELL_TARGET = "KIT_NOTEBOOK_CELL"       # stands for "this cell" in a rerun command, replaced before it is shown


# ---- in each rank ------------------------------------------------------------------------------------------

class _Output(io.StringIO):
    """A rank's stdout and stderr during a cell: kept for the reply, and copied line by line to a file that
    the kernel reads when the call never replies (a hang) or fails."""

    def __init__(self, path):
        super().__init__()
        self._copy = open(path, "w", encoding="utf-8") if path else None

    def write(self, text):
        n = super().write(text)
        if self._copy is not None:
            self._copy.write(text)
            self._copy.flush()
        return n

    def done(self):
        if self._copy is not None:
            self._copy.close()


def _summary(value, depth: int = 0):
    """A cell's last value as plain data for the reply: a tensor as its shape, dtype, device and first values;
    a list, tuple or dict of them item by item (a few); anything else as its (shortened) repr."""
    import torch
    if isinstance(value, torch.Tensor):
        try:
            head = value.detach().flatten()[:6].cpu().tolist()
        except Exception:   # meta, quantized, sparse: no values to show
            head = None
        return {"tensor": {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", ""),
                           "device": str(value.device), "numel": value.numel(), "values": head,
                           "requires_grad": bool(value.requires_grad)}}
    if depth < 2 and isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return {"items": [_summary(v, depth + 1) for v in value[:8]], "type": type(value).__name__,
                "len": len(value)}
    if depth < 2 and isinstance(value, dict) and any(isinstance(v, torch.Tensor) for v in value.values()):
        pairs = list(value.items())[:8]
        return {"pairs": [[repr(k)[:60], _summary(v, depth + 1)] for k, v in pairs], "len": len(value)}
    try:
        text = repr(value)
    except Exception as e:   # a repr that raises
        text = f"<{type(value).__name__}: repr raised {type(e).__name__}>"
    return {"repr": text if len(text) <= 2000 else text[:2000] + " ..."}


def _run_on_rank(source: str, filename: str, out_file):
    """One cell, in this rank's own namespace (kept across cells in a module of this rank's sys.modules):
    its statements, then its last expression's value, as IPython does; what it prints is captured."""
    import ast
    import builtins
    import contextlib
    import linecache
    import os
    import sys
    import types

    import torch
    import torch.distributed as dist

    import harness as engine

    module = sys.modules.get(_NAMESPACE)
    fresh = module is None
    if fresh:
        module = types.ModuleType(_NAMESPACE, "this rank's namespace in notebook mode")
        module.__dict__.update(__builtins__=builtins, torch=torch, dist=dist, rank=dist.get_rank(),
                               world_size=dist.get_world_size(), device=engine.device(), phase=engine.phase)
        sys.modules[_NAMESPACE] = module
    namespace = module.__dict__
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)   # tracebacks show lines
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not source.rstrip().endswith(";"):
        last = ast.Expression(tree.body.pop().value)
    output, value = _Output(out_file), None
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            exec(compile(tree, filename, "exec"), namespace)
            if last is not None:
                value = eval(compile(last, filename, "eval"), namespace)
    finally:
        output.done()
    if value is not None:
        namespace["_"] = value
    return {"out": output.getvalue(), "value": None if value is None else _summary(value), "fresh": fresh,
            "pid": os.getpid()}


# ---- in the kernel: running a cell ---------------------------------------------------------------------------

@dataclasses.dataclass
class CellRun:
    """What one ``%%ranks`` cell gave: each rank's output and value, or the failure in the harness's words."""
    label: str
    world_size: int
    backend: str
    replies: dict = dataclasses.field(default_factory=dict)   # rank -> {"out", "value", "fresh", "pid"}
    outputs: dict = dataclasses.field(default_factory=dict)   # rank -> what it printed (also on a failure)
    error: str = ""            # the failure's report (RankError.render(), HangError's text, ...)
    error_kind: str = ""       # the exception's class name
    trace: object = None       # harness.Trace of a call that succeeded
    notes: list = dataclasses.field(default_factory=list)   # said above the ranks' output
    seconds: float = 0.0


class Ranks:
    """The kernel's side of ``%%ranks``: where cells are written, the ranks' output folder, and what it knows of
    each world (its ranks' pids), to say when a world was replaced and its namespaces lost."""

    def __init__(self):
        self.folder = None      # cells' source files, written before they run
        self.shared = None      # harness.SharedFolder: each rank's output, line by line
        self.worlds = {}        # (world size, backend) -> its ranks' pids at their last success, or "stopped"
        self.count = 0

    def _ready(self):
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="kit-nb-")
            atexit.register(shutil.rmtree, self.folder, True)
            self.shared = harness.SharedFolder()

    def _cell_file(self, source: str, number) -> str:
        self.count += 1
        name = f"cell{number}.py" if number is not None else f"cell-{self.count}.py"
        path = os.path.join(self.folder, name)
        if os.path.exists(path):   # the same cell run again: keep the file that earlier reports name
            path = os.path.join(self.folder, f"{name[:-3]}-{self.count}.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        return path

    def run(self, source: str, world_size: int, backend: str = "gloo", timeout: float = _DEFAULT_TIMEOUT,
            number=None) -> CellRun:
        """Run ``source`` on the ``world_size`` ranks of the (warm) world for ``backend``."""
        self._ready()
        path = self._cell_file(source, number)
        label = os.path.basename(path)[:-3]
        result = CellRun(label, world_size, backend)
        try:
            ast.parse(source, path)
        except SyntaxError as e:
            result.error_kind = "SyntaxError"
            result.error = f"SyntaxError in {label}, line {e.lineno}: {e.msg}\n    {(e.text or '').rstrip()}"
            return result
        tag = f"{label}-{self.count}"
        outs = {r: os.path.join(self.shared.path, f"{tag}-r{r}.txt") for r in range(world_size)}
        key, started = (world_size, backend), time.perf_counter()
        try:
            done = harness.run(_run_on_rank, world_size, source, path, harness.per_rank(list(outs.values())),
                               timeout=timeout, backend=backend, probes=[self.shared])
        except (harness.RankError, harness.NotImplementedYet) as e:
            result.error_kind, result.error = type(e).__name__, _rank_report(e)
        except harness.HangError as e:
            result.error_kind, result.error = "HangError", _without_call(str(e))
        except (harness.HarnessError, harness.TraceTampered, TypeError, ValueError) as e:
            result.error_kind, result.error = type(e).__name__, f"{type(e).__name__}: {e}"
        else:
            result.replies = dict(enumerate(done.values))
            result.trace = done.trace
        finally:
            result.seconds = time.perf_counter() - started
        result.outputs = {r: reply["out"] for r, reply in result.replies.items()} if not result.error else \
            {r: _read(p) for r, p in outs.items()}
        for p in outs.values():
            _remove(p)
        self._notes(result, key)
        result.error = _tidy(result.error)
        return result

    def _notes(self, result: CellRun, key):
        known = self.worlds.get(key)
        if result.error:
            if isinstance(known, list) and not all(os.path.exists(f"/proc/{pid}") for pid in known):
                self.worlds[key] = "stopped"
                result.notes.append(f"the harness stopped these {result.world_size} ranks after this failure: "
                                    f"the next %%ranks {result.world_size} cell starts fresh ranks, "
                                    "without the variables of earlier cells")
            return
        pids = [reply["pid"] for _, reply in sorted(result.replies.items())]
        if known is not None and known != pids:
            result.notes.append("fresh ranks (the harness replaced the earlier ones, after a failure): the "
                                "variables of earlier cells are gone")
        self.worlds[key] = pids

    def reset(self):
        harness.shutdown()
        self.worlds.clear()


def _ours(file: str) -> bool:
    return file.replace(os.sep, "/").endswith("kit/notebook.py")


def _rank_report(error) -> str:
    """The harness's report of a rank that raised (``render()``), without this module's own frame."""
    frames = [f for f in error.frames if not _ours(f[0])]
    return type(error)(error.rank, error.exc_type, error.exc_message, frames, error.world_size).render()


def _without_call(text: str) -> str:
    """A hang report without its last line, which repeats the call: here that is the whole cell, as a string."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("  the call: "))


def _tidy(text: str) -> str:
    """Paths of cell files said as the cell's name (``cell3.py``)."""
    return re.sub(r"[^\s\"']*kit-nb-[^/\s\"']+/", "", text or "")


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _remove(path: str):
    try:
        os.remove(path)
    except OSError:
        pass


# ---- in the kernel: showing a cell -----------------------------------------------------------------------------

_CSS = f"""
.{_SCOPE} {{ font: 13px system-ui, sans-serif; }}
.{_SCOPE} .ranks {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(18em, 1fr)); gap: 6px; }}
.{_SCOPE} .rank {{ border: 1px solid #ccd; border-radius: 4px; padding: 4px 8px; background: #fbfbfd; }}
.{_SCOPE} .head {{ font-weight: bold; color: #335; }}
.{_SCOPE} pre {{ margin: 2px 0; white-space: pre-wrap; font: 12px monospace; }}
.{_SCOPE} .value {{ font: 12px monospace; color: #063; }}
.{_SCOPE} .error {{ border-left: 4px solid #c0392b; background: #fdf2f2; padding: 4px 8px; margin: 4px 0; }}
.{_SCOPE} .note {{ color: #8a5a00; margin: 2px 0; }}
.{_SCOPE} .pass {{ color: #1e8449; }} .{_SCOPE} .fail {{ color: #c0392b; }}
.{_SCOPE} table.score {{ border-collapse: collapse; font-size: 13px; }}
.{_SCOPE} table.score td, .{_SCOPE} table.score th {{ padding: 1px 10px; text-align: left; font-size: 13px; }}
.{_SCOPE} table.score th {{ border-bottom: 1px solid #ccc; }} .{_SCOPE} pre.settings {{ color: #777; font-size: 11px; }}
.{_SCOPE} .scroll {{ overflow-x: auto; }}
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _number(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def describe(summary) -> str:
    """One line for a rank's value summary (``_summary``)."""
    if summary is None:
        return ""
    if "tensor" in summary:
        t = summary["tensor"]
        shown = "" if t["values"] is None else ", ".join(_number(v) for v in t["values"])
        more = ", ..." if t["values"] is not None and t["numel"] > len(t["values"]) else ""
        grad = ", requires_grad" if t["requires_grad"] else ""
        return f"tensor shape {list(t['shape'])} {t['dtype']} on {t['device']}{grad}: [{shown}{more}]"
    if "items" in summary:
        inner = "; ".join(describe(s) for s in summary["items"])
        return f"{summary['type']} of {summary['len']}: {inner}" + ("; ..." if summary["len"] > 8 else "")
    if "pairs" in summary:
        inner = "; ".join(f"{k}: {describe(s)}" for k, s in summary["pairs"])
        return f"dict of {summary['len']}: {inner}" + ("; ..." if summary["len"] > 8 else "")
    return summary.get("repr", "")


def cell_text(run: CellRun, only_rank=None) -> str:
    """The plain-text form of a cell's output (text/plain): each rank's lines, prefixed with its number."""
    lines = [f"note: {n}" for n in run.notes]
    for r in _shown_ranks(run, only_rank):
        out = run.outputs.get(r, "")
        lines += [f"rank {r} | {line}" for line in out.rstrip("\n").splitlines()] if out.strip() else []
        value = describe(run.replies.get(r, {}).get("value"))
        if value:
            lines.append(f"rank {r} | Out: {value}")
    if run.error:
        lines.append(f"{run.error_kind}: {run.error}" if not run.error.startswith(run.error_kind) else run.error)
    return "\n".join(lines) if lines else f"({run.label}: no output on {run.world_size} ranks)"


def cell_html(run: CellRun, only_rank=None) -> str:
    """The rich form: a box per rank (its output, its value), then the failure, if any."""
    parts = [f'<div class="{_SCOPE}" data-cell="{_e(run.label)}"><style>{_CSS}</style>']
    parts += [f'<div class="note">{_e(n)}</div>' for n in run.notes]
    boxes = []
    for r in _shown_ranks(run, only_rank):
        out, value = run.outputs.get(r, ""), describe(run.replies.get(r, {}).get("value"))
        body = (f"<pre>{_e(out.rstrip())}</pre>" if out.strip() else "") + \
               (f'<div class="value">Out: {_e(value)}</div>' if value else "")
        boxes.append(f'<div class="rank" data-rank="{r}"><div class="head">rank {r}</div>{body}</div>')
    if boxes:
        parts.append(f'<div class="ranks">{"".join(boxes)}</div>')
    if run.error:
        parts.append(f'<div class="error"><b>{_e(run.error_kind)}</b><pre>{_e(run.error)}</pre></div>')
    parts.append(f'<div class="note" style="color:#888">{_e(run.label)} on {run.world_size} ranks '
                 f'({_e(run.backend)}), {run.seconds:.2f} s</div></div>')
    return "".join(parts)


def _shown_ranks(run: CellRun, only_rank) -> list:
    ranks = sorted(set(run.outputs) | set(run.replies)) or []
    return [r for r in ranks if only_rank is None or r == only_rank]


def timeline_html(trace, title: str):
    """The call's communication, one lane per rank (``kit.timeline_html``), as a fragment for the notebook page:
    its stylesheet scoped under one class, so it styles nothing else on the page.  None when nothing was traced."""
    from .timeline_html import render_html
    chrome = harness.to_chrome(trace)
    if not any(e.get("ph") == "X" for e in chrome.get("traceEvents", [])):
        return None
    return scoped(render_html(chrome, title), f"{_SCOPE}-timeline")


def scoped(page: str, scope: str) -> str:
    """A whole HTML page as a fragment: its <body>, and its <style> with every selector under ``.scope``."""
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    body = re.search(r"<body>(.*)</body>", page, re.S)
    if not (style and body):
        return f'<iframe class="{scope}" style="width:100%;height:480px;border:0" srcdoc="{_e(page)}"></iframe>'
    rules = []
    for rule in style.group(1).split("}"):
        if "{" not in rule:
            continue
        selectors, declarations = rule.split("{", 1)
        under = ", ".join(f".{scope}" if s.strip() == "body" else f".{scope} {s.strip()}"
                          for s in selectors.split(",") if s.strip())
        rules.append(f"{under} {{{declarations}}}")
    return f'<div class="{scope} {_SCOPE}"><style>{"".join(rules)}</style><div class="scroll">{body.group(1)}</div></div>'


def _ops(trace) -> int:
    return sum(len(trace.ops(r)) for r in range(trace.world_size))


# ---- in the kernel: judging --------------------------------------------------------------------------------------

@dataclasses.dataclass
class JudgeRun:
    verdict: object = None
    text: str = ""
    error: str = ""


def judge(number: int, code: str | None = None, target: str | None = None, profile: str | None = None,
          seed: int | None = None, select: str | None = None, backend: str | None = None, lang: str | None = None,
          timeout: float = 600) -> JudgeRun:
    """Judge problem ``number``: ``code`` (the cell) as the submission, else ``target``, else the practice file."""
    from .judging import InternalError, UsageError
    try:
        problems = catalogue.load()
        if number not in problems:
            raise UsageError(f"no problem {number}; the problems are {', '.join(map(str, sorted(problems)))}")
        problem = problems[number]
        given = {k: v for k, v in dict(profile=profile, backend=backend, lang=lang).items() if v is not None}
        try:
            config = KitConfig(**given)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if code is None:
            path = os.path.abspath(target) if target else problem.practice_file()
            if not os.path.isfile(path):
                raise UsageError(f"no file {path}")
            verdict = judge_once(problem, path, config, seed=seed, select=select, timeout=timeout)
            return JudgeRun(verdict, report_text(verdict, ["--target", path] if target else [], select, config.lang))
        folder = tempfile.mkdtemp(prefix="kit-nb-judge-")
        try:
            path = os.path.join(folder, problem.file)
            with open(path, "w", encoding="utf-8") as f:
                f.write(code)
            verdict = judge_once(problem, path, config, seed=seed, select=select, timeout=timeout)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        verdict.target = "this cell"
        return JudgeRun(verdict, report_text(verdict, ["--target", _CELL_TARGET], select, config.lang))
    except (UsageError, InternalError, catalogue.CatalogueError) as e:
        return JudgeRun(error=f"{type(e).__name__}: {e}")


def report_text(verdict, target_args: list, select: str | None, lang: str) -> str:
    """The judge's own report (``render_text``): the header and score table, then the first failure only (what
    ``--watch`` shows); every rerun command said as the magic that reruns it here."""
    from .report import render_text
    whole, brief = io.StringIO(), io.StringIO()
    with _plain_console():
        render_text(verdict, target_args, out=whole, select=select, lang=lang)
        if not verdict.all_passed:
            render_text(verdict, target_args, out=brief, brief=True, select=select, lang=lang)
    text = whole.getvalue()
    if not verdict.all_passed:
        table = text.split("\n\n", 1)[0]
        first = brief.getvalue().split("\n", 1)[1] if "\n" in brief.getvalue() else ""   # after its score line
        text = table + "\n" + first.rstrip("\n") + "\n"
    number = verdict.problem.number
    text = text.replace(f"python judge.py {number} --target {_CELL_TARGET}", f"%%judge {number}")
    if "--target" not in target_args:
        text = text.replace(f"python judge.py {number} ", f"%judge {number} ")
    return _tidy(text)


@contextlib.contextmanager
def _plain_console():
    """``render_text`` writing plain lines to its stream: in a kernel, rich's console would otherwise notice
    Jupyter and display its output itself, in colour, instead of writing it to the stream it was given.  The
    console is the one ``kit.report.console`` makes for a stream that is not a terminal, told it is not in
    Jupyter."""
    from rich.console import Console
    from . import report
    made = report.console

    def plain(stream=None):
        return Console(file=stream or sys.stdout, highlight=False, soft_wrap=True, width=100, force_jupyter=False,
                       force_terminal=False)
    report.console = plain
    try:
        yield
    finally:
        report.console = made


def judge_html(run: JudgeRun) -> str:
    """The score table as a table, the run's settings, and the rest of the judge's report (the first failure)."""
    if run.error:
        return f'<div class="{_SCOPE}"><style>{_CSS}</style><div class="error"><pre>{_e(run.error)}</pre></div></div>'
    v = run.verdict
    rows = "".join(
        f'<tr><td>{_e(t.name)}</td><td>{t.points:g}/{t.max_points:g}</td>'
        f'<td class="{"pass" if t.passed else "fail"}">{"pass" if t.passed else _e(t.kind or "fail")}</td>'
        f'<td>{t.duration:.1f}s</td></tr>' for t in v.tests)
    status = "pass" if v.all_passed else "fail"
    table, _, rest = run.text.partition("\n\n")
    lines = table.splitlines()
    settings = "\n".join(lines[1:3])   # the report's target/profile/seed line and its protections
    score = max((i for i, line in enumerate(lines) if f"{v.score:g}/{v.max_score:g}" in line), default=len(lines))
    rest = "\n".join(lines[score + 1:] + [rest])   # what follows the score line: all hold, or the first failure
    return (f'<div class="{_SCOPE}" data-score="{v.score:g}/{v.max_score:g}"><style>{_CSS}</style>'
            f'<div class="head">{_e(v.problem.number)} · {_e(v.problem.title)}: '
            f'<span class="{status}">score {v.score:g}/{v.max_score:g}</span> ({v.elapsed:.1f} s)</div>'
            f'<pre class="settings">{_e(settings)}</pre>'
            f'<table class="score"><tr><th>test</th><th>points</th><th>result</th><th>time</th></tr>{rows}</table>'
            + (f'<pre>{_e(rest.strip())}</pre>' if rest.strip() else "") + '</div>')


# ---- the magics ------------------------------------------------------------------------------------------------

_RANKS = Ranks()


def _cleanup():
    """Stop every rank the kernel started: at exit, and when the kernel is asked to shut down."""
    try:
        _RANKS.reset()
    except Exception:
        pass


def _magics():
    from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
    from IPython.core.error import UsageError
    from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
    from IPython.display import display

    def show(text: str, markup: str, display_id=None):
        display({"text/plain": text, "text/html": markup}, raw=True, display_id=display_id)

    def judge_arguments(f):
        for arg in reversed([
                argument("number", type=int, help="the problem's number"),
                argument("--profile", choices=["quick", "default", "thorough"], help="examples per property"),
                argument("--seed", type=int, help="fix the examples"),
                argument("-k", dest="select", help="only the tests matching this pytest expression"),
                argument("--backend", choices=["gloo", "nccl", "auto"]),
                argument("--lang", choices=["en", "zh"], help="the report's language"),
                argument("--target", help="judge this file instead of the practice file (the line magic only)")]):
            f = arg(f)
        return magic_arguments()(f)

    @magics_class
    class KitMagics(Magics):
        @magic_arguments()
        @argument("world_size", type=int, help="how many ranks")
        @argument("--rank", type=int, default=None, help="show this rank's output only")
        @argument("--backend", default=None, choices=["gloo", "nccl", "auto"],
                  help="the process-group backend (default gloo, or KIT_BACKEND)")
        @argument("--timeout", type=float, default=_DEFAULT_TIMEOUT, help="seconds before the cell is a hang")
        @argument("--no-timeline", action="store_true", help="do not draw the communication timeline")
        @cell_magic
        def ranks(self, line, cell):
            """Run the cell on N warm ranks, each in its own namespace kept across cells."""
            args = parse_argstring(self.ranks, line)
            if args.rank is not None and not 0 <= args.rank < args.world_size:
                raise UsageError(f"--rank {args.rank}: a world of {args.world_size} ranks has ranks 0 to "
                                 f"{args.world_size - 1}")
            backend = args.backend or KitConfig().backend
            # the magic's line as a comment first: the cell's lines keep their numbers in tracebacks
            # (the shell counts the cell before it runs it: this cell is In[execution_count - 1])
            run = _RANKS.run(f"# %%ranks {line}\n{cell}", args.world_size, backend, args.timeout,
                             max(self.shell.execution_count - 1, 1))
            show(cell_text(run, args.rank), cell_html(run, args.rank))
            if run.trace is not None and not args.no_timeline:
                markup = timeline_html(run.trace, f"{run.label}: communication on {run.world_size} ranks")
                if markup is not None:
                    show(f"timeline of {run.label}: {_ops(run.trace)} communication ops on {run.world_size} "
                         "ranks (drawn in the HTML output)", markup)

        @line_magic
        def ranks_reset(self, line):
            """Stop every rank (harness.shutdown): the next %%ranks cell starts fresh ranks and namespaces."""
            _RANKS.reset()
            print("ranks stopped: the next %%ranks cell starts fresh ranks, with empty namespaces")

        @judge_arguments
        @line_magic
        def judge(self, line):
            """Judge the problem's practice file (or --target FILE): the score table and the first failure."""
            args = parse_argstring(self.judge, line)
            self._judge(args, None)

        @judge_arguments
        @cell_magic("judge")
        def judge_cell(self, line, cell):
            """Judge the cell's code as the submission."""
            args = parse_argstring(self.judge_cell, line)
            self._judge(args, f"# %%judge {line}\n{cell}")   # as the cell shows it: the same line numbers

        def _judge(self, args, code):
            what = "this cell" if code is not None else (args.target or "the practice file")
            handle = display({"text/plain": f"judging problem {args.number}: {what} ..."}, raw=True,
                             display_id=True)
            run = judge(args.number, code, args.target if code is None else None, args.profile, args.seed,
                        args.select, args.backend, args.lang)
            text = run.error or run.text
            handle.update({"text/plain": text, "text/html": judge_html(run)}, raw=True)

    return KitMagics


def _stop_helpers():
    """End and reap the helper processes the harness started in this kernel, after its worlds are stopped:
    multiprocessing's forkserver (torch preloaded, so a graceful exit takes seconds) and its resource tracker
    (which ignores SIGTERM).  At a shutdown request ipykernel signals every child it finds and waits while any
    is left, zombies included: these kept it waiting past the front end's patience (2.5 s), which then killed
    the kernel before its atexit handlers ran.  They are found in /proc: children of this process whose
    command line is multiprocessing's."""
    import signal
    for pid in _children(os.getpid(), ("from multiprocessing.forkserver import", "from multiprocessing.resource_tracker import")):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (OSError, ChildProcessError):
            pass


def _children(parent: int, marks: tuple) -> list:
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if any(mark in command for mark in marks):
            found.append(int(name))
    return found


def load_ipython_extension(ipython):
    ipython.register_magics(_magics())
    atexit.register(_cleanup)
    try:
        harness.prestart()   # the forkserver imports torch meanwhile: the first %%ranks cell waits less
    except Exception:
        pass
    kernel = getattr(ipython, "kernel", None)
    original = getattr(kernel, "do_shutdown", None)
    if original is not None and not getattr(original, "kit_cleanup", False):
        def do_shutdown(restart):
            _cleanup()
            _stop_helpers()
            return original(restart)
        do_shutdown.kit_cleanup = True
        kernel.do_shutdown = do_shutdown


def unload_ipython_extension(ipython):
    _cleanup()


# ---- python -m kit.notebook make N ------------------------------------------------------------------------------

def _markdown_cells(statement: str, folder_rel: str) -> list:
    """The statement, a cell per ``## `` section (a fence is never split), links made relative to notebooks/."""
    def relink(m):
        target = m.group(2)
        if re.match(r"[a-z]+:|#|/", target):
            return m.group(0)
        return f"]({os.path.normpath(os.path.join('..', folder_rel, target))})"
    chunks, current, fenced = [], [], False
    for line in statement.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if line.startswith("## ") and not fenced and current:
            chunks.append(current)
            current = []
        current.append(line)
    if current:
        chunks.append(current)
    return [re.sub(r"\]\(([^)\s]*?)?([^)\s]+)\)", relink, "\n".join(c).strip("\n")) for c in chunks]


def _cell(kind: str, source: str, index: int) -> dict:
    cell = {"cell_type": kind, "id": f"kit-{index:02d}", "metadata": {}, "source": source.splitlines(True)}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def _stub(problem) -> str:
    """The practice file while it is still the stub, else the stub committed in git."""
    from .stubs import is_stub, pristine_stub
    with open(problem.practice_file(), encoding="utf-8") as f:
        source = f.read()
    if is_stub(source, problem.names):
        return source
    try:
        return pristine_stub(problem)
    except Exception:
        return source


def make_notebook(problem, lang: str = "en") -> dict:
    """Problem ``problem``'s notebook (nbformat 4 JSON): the statement, the extension, a cell to try things on
    ranks, and the stub as a ``%%judge`` cell."""
    from . import statements
    folder_rel = os.path.relpath(os.path.dirname(problem.practice_file()), ROOT)
    n = problem.number
    cells = [("markdown", text) for text in _markdown_cells(statements.read(problem, lang), folder_rel)]
    cells += [
        ("markdown", "## In this notebook\n\n"
                     "Run the next cell once: it loads notebook mode (`pip install -e '.[notebook]'` installs "
                     "what it needs). `%%ranks N` runs a cell on N real ranks, each with its own variables "
                     "(`rank`, `world_size`, `torch`, `dist`, `device` and `phase` are there to start with), "
                     "and draws the cell's communication. The last code cell holds the stub: write your solution "
                     f"there and run it; `%%judge {n}` on its first line judges the cell's code as your file "
                     f"(`--profile quick` for a faster, smaller run; `%judge {n}` judges "
                     f"`{folder_rel}/{problem.file}` instead)."),
        ("code", "%load_ext kit.notebook"),
        ("markdown", "Try things on two ranks: each rank runs the cell, then shows what it printed and its last "
                     "value."),
        ("code", "%%ranks 2\nt = torch.arange(3.0, device=device) * (rank + 1)\ndist.all_reduce(t)\n"
                 "print(f'rank {rank} of {world_size}')\nt"),
        ("markdown", f"Your solution: this cell is the file `{problem.file}`. Run it to judge it."),
        ("code", f"%%judge {n}\n" + _stub(problem).rstrip("\n") + "\n"),
    ]
    return {"cells": [_cell(kind, source, i) for i, (kind, source) in enumerate(cells)],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def notebook_path(problem, lang: str = "en", out_dir: str | None = None) -> str:
    suffix = "" if lang == "en" else f".{lang}"
    return os.path.join(out_dir or os.path.join(ROOT, "notebooks"), f"{problem.folder}{suffix}.ipynb")


def write_notebook(problem, lang: str = "en", out_dir: str | None = None) -> str:
    path = notebook_path(problem, lang, out_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(make_notebook(problem, lang), f, indent=1, ensure_ascii=False)
        f.write("\n")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.notebook", description="notebook mode's tools")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make", help="write notebooks/<number>_<slug>.ipynb from the problem's statement")
    make.add_argument("numbers", type=int, nargs="+")
    make.add_argument("--lang", choices=["en", "zh"], default="en", help="the statement's language")
    make.add_argument("--out", help="the folder to write to (default notebooks/)")
    args = parser.parse_args(argv)
    problems = catalogue.load()
    unknown = [n for n in args.numbers if n not in problems]
    if unknown:
        print(f"no problem {', '.join(map(str, unknown))}; the problems are "
              f"{', '.join(map(str, sorted(problems)))}", file=sys.stderr)
        return 4
    for n in args.numbers:
        path = write_notebook(problems[n], args.lang, args.out)
        inside = not os.path.relpath(path).startswith("..")
        print(os.path.relpath(path) if inside else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
