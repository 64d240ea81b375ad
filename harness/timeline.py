"""A call's trace as a timeline: Chrome trace-event JSON (Perfetto, chrome://tracing)."""
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


def _counters(rank: int, ops: list, spans: list) -> list:
    """Counter events: the bytes this rank has put on the wire so far, and how many of its ops are in flight."""
    changes = sorted([(start, 1, op.in_bytes if op.kind != "recv" else 0) for op, (start, _) in zip(ops, spans)] +
                     [(end, -1, 0) for end in (end for _, end in spans)])
    sent = in_flight = 0
    events = []
    for ts, step, nbytes in changes:
        sent, in_flight = sent + nbytes, in_flight + step
        events.append({"ph": "C", "pid": rank, "name": "bytes sent", "ts": ts * 1e6, "args": {"bytes": sent}})
        events.append({"ph": "C", "pid": rank, "name": "ops in flight", "ts": ts * 1e6, "args": {"ops": in_flight}})
    return events


def to_chrome(trace: Trace) -> dict:
    """One process per rank, with a 'compute' thread (the marked phases), 'comm' threads (every op) and two
    counters: the bytes it has sent so far, and its ops in flight.

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
        events += _counters(rank, ops, spans)
    return {"traceEvents": events, "displayTimeUnit": "ms"}
