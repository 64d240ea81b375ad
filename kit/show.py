"""What --trace and --show put in front of a learner: a call's timeline as Chrome JSON or as terminal lanes."""
from __future__ import annotations

import os

from harness import to_chrome  # noqa: F401  (re-exported: the session writes each test's trace with it)


def trace_file_name(test_name: str) -> str:
    """The file, inside judge.py's trace folder, that holds a test's last traced call."""
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in test_name) + ".json"


def pick(problem, verdict, traces: dict):
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


def drawing(problem, verdict) -> str | None:
    """The drawing that the catalogue's ``show`` test recorded in this run, if any."""
    for t in verdict.tests:
        if problem.show and t.name.split("[")[0] == problem.show and t.drawing:
            return t.drawing
    return None


def write_html(problem, test, chrome: dict, folder: str) -> str:
    """The timeline as a self-contained page (``kit.timeline_html``), with the test's cost figures; its path."""
    from .timeline_html import render_html
    from .report import cost_ratio
    costs = [{**f, "ratio": cost_ratio(f["model"], f["yours"])} for f in (test.cost or {}).get("figures", [])]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"timeline-{problem.number}.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(chrome, f"{problem.number} · {problem.title}: {test.name}", costs or None))
    return path


def render_lanes(chrome: dict, width: int = 72, exposed_after: str = "backward") -> list[tuple[str, str]]:
    """Terminal lanes from a Chrome trace: per rank a compute lane and a comm lane.

    Returns (text, style) pieces; comm that runs after the last ``exposed_after`` phase
    ends is marked '!' and styled as exposed.
    """
    spans = [e for e in chrome["traceEvents"] if e.get("ph") == "X"]
    if not spans:
        return [("(no phases or communication recorded)\n", "")]
    t_end = max(e["ts"] + e["dur"] for e in spans) or 1.0
    scale = (width - 1) / t_end
    letters = _phase_letters(sorted({e["name"].split(" ")[0] for e in spans if e["tid"] == 0}))
    pieces = []
    for rank in sorted({e["pid"] for e in spans}):
        mine = [e for e in spans if e["pid"] == rank]
        hide_until = max((e["ts"] + e["dur"] for e in mine if e["tid"] == 0 and e["name"].startswith(exposed_after)),
                         default=None)
        compute, comm = [" "] * width, [" "] * width
        for e in mine:
            a, b = int(e["ts"] * scale), max(int((e["ts"] + e["dur"]) * scale), int(e["ts"] * scale) + 1)
            lane = compute if e["tid"] == 0 else comm
            mark = letters.get(e["name"].split(" ")[0], "?") if e["tid"] == 0 else "="
            for x in range(a, min(b, width)):
                lane[x] = mark
        pieces.append((f"rank {rank} compute |", "bold"))
        pieces.append(("".join(compute) + "\n", "cyan"))
        pieces.append((f"rank {rank} comm    |", "bold"))
        cut = int(hide_until * scale) if hide_until is not None else width
        hidden, exposed = "".join(comm[:cut]), "".join("!" if c == "=" else c for c in comm[cut:])
        pieces.append((hidden, "green"))
        pieces.append((exposed + "\n", "bold red"))
    pieces.append((f"{'':15}0{'':>{width - 12}}{t_end / 1000:.2f} ms\n", "dim"))
    legend = ", ".join(f"{letter} {name}" for name, letter in letters.items())
    pieces.append((f"compute: {legend or 'no phases marked'}; comm: '=' hidden behind backward, "
                   "'!' exposed after it\n", "dim"))
    return pieces


def _phase_letters(names: list) -> dict:
    """A distinct letter per phase name: its first free letter, so 'ring_a' and 'ring_b' differ."""
    letters = {}
    for name in names:
        candidates = [c.upper() for c in name if c.isalpha()] + list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
        letters[name] = next(c for c in candidates if c not in letters.values())
    return letters
