"""A call's trace as a timeline: Chrome trace-event JSON (Perfetto, chrome://tracing) or terminal lanes."""
from __future__ import annotations

from .trace import Trace


def _op_span(op) -> tuple[float, float]:
    end = op.wait_end if op.wait_end is not None else op.issued_at
    return op.issued_at, max(end, op.issued_at + 1e-6)


def _rows(spans: list) -> list[int]:
    """A row per span such that spans on one row never overlap (greedy interval partitioning).

    Chrome's trace format requires complete events on one thread to nest; two async ops in
    flight at once do not, so each gets a row of its own.
    """
    row_ends: list[float] = []
    rows = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i]):
        start, end = spans[i]
        free = next((r for r, last in enumerate(row_ends) if last <= start), None)
        if free is None:
            free = len(row_ends)
            row_ends.append(end)
        row_ends[free] = end
        rows[i] = free
    return rows


def to_chrome(trace: Trace) -> dict:
    """One process per rank, with a 'compute' thread (the marked phases) and 'comm' threads (every op).

    Ops in flight at the same time (async all_reduces, say) go on separate comm rows
    ("comm", "comm 2", ...), so no two events on one row overlap without nesting.
    """
    events = []
    for rank in range(trace.world_size):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "compute (phases)"}})
        for p in trace.phases(rank):
            end = p.end if p.end is not None else p.start
            events.append({"ph": "X", "pid": rank, "tid": 0, "name": p.name + ("" if p.step is None else f" {p.step}"),
                           "ts": p.start * 1e6, "dur": max(end - p.start, 1e-6) * 1e6})
        ops = trace.ops(rank)
        spans = [_op_span(op) for op in ops]
        rows = _rows(spans)
        for row in range(max(rows, default=0) + 1):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 1 + row,
                           "args": {"name": "comm" if row == 0 else f"comm {row + 1} (in flight at once)"}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": 1 + row,
                           "args": {"sort_index": 1 + row}})
        for op, (start, end), row in zip(ops, spans, rows):
            events.append({"ph": "X", "pid": rank, "tid": 1 + row, "name": op.kind, "ts": start * 1e6,
                           "dur": (end - start) * 1e6,
                           "args": {"bytes": op.in_bytes, "peer": op.peer, "site": op.site, "phase": op.phase,
                                    "step": op.step, "blocking": op.blocking, "shapes": [list(s) for s in op.shapes]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def trace_file_name(test_name: str) -> str:
    """The file, inside judge.py's trace folder, that holds a test's last traced call."""
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in test_name) + ".json"


_SINK = None


def set_sink(callback):
    """Hand every successful call's trace to ``callback(trace)`` (the pytest plugin, for judge.py --show)."""
    global _SINK
    _SINK = callback


def save_if_asked(trace: Trace):
    """Called by ``harness.run`` after each successful call; a no-op unless judge.py --trace/--show asked."""
    if _SINK is not None:
        _SINK(trace)


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
