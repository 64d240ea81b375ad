"""Draw a pipeline schedule, or its simulated timeline, as a per-stage grid of text (problem 118's tests).

A schedule (one op list per stage, ops like ``("F", 0)``) becomes one line per stage,
the ops in list order::

    >>> print(render_grid([[("F", 0), ("F", 1), ("B", 0), ("B", 1)],
    ...                    [("F", 0), ("B", 0), ("F", 1), ("B", 1)]]))
    stage 0 | F0 F1 B0 B1
    stage 1 | F0 B0 F1 B1

A timeline (per stage, ``(op, start, end)`` events, or anything with an ``.events``
attribute such as ``simulate``'s result) puts each op on a time axis: one cell per
time unit (the shortest op by default), ``.`` where the stage idles::

    >>> print(render_grid([[(("F", 0), 0, 1), (("F", 1), 1, 2), (("B", 0), 3, 5), (("B", 1), 5, 7)],
    ...                    [(("F", 0), 1, 2), (("B", 0), 2, 3), (("F", 1), 3, 4), (("B", 1), 4, 5)]]))
    stage 0 | F0 F1 .  B0    B1
    stage 1 | .  F0 B0 F1 B1

Anything else degrades to plain text (one ``repr`` per stage, or of the whole value);
``render_grid`` never raises, so a test can draw whatever a learner's code returned.
``color=True`` adds ANSI colours (forwards green, backwards cyan, idle dim).
"""
from __future__ import annotations

import math

_STYLE = {"F": "green", "B": "cyan", "idle": "dim"}
_ANSI = {"green": "\x1b[32m", "cyan": "\x1b[36m", "dim": "\x1b[2m"}
_RESET = "\x1b[0m"


def render_grid(schedule_or_events, unit: float | None = None, color: bool = False) -> str:
    """One line per stage: the ops of a schedule, or a timeline's ops on a time axis.  Never raises."""
    return "\n".join(_join(line, color) for line in _lines(schedule_or_events, unit))


def _join(segments, color: bool) -> str:
    text = "".join(f"{_ANSI[style]}{piece}{_RESET}" if color and style else piece for piece, style in segments)
    return text.rstrip()


def _lines(value, unit=None) -> list:
    """Each line as (text, style) segments."""
    try:
        events = getattr(value, "events", None)
        if events is None and isinstance(value, dict):
            events = value.get("events")
        stages = list(events if events is not None else value)
        if stages and all(_is_event_list(s) for s in stages) and any(len(s) for s in stages):
            return _timeline(stages, unit)
        if all(_is_op_list(s) for s in stages):
            return _schedule(stages)
        return [[(f"stage {s} | ", None), (_short(repr(ops)), None)] for s, ops in enumerate(stages)]
    except Exception:  # noqa: BLE001 -- a drawing must never take the judge down
        return [[(_short(_safe_repr(value)), None)]]


def _is_op(op) -> bool:
    try:
        return len(op) == 2 and str(op[0]) in ("F", "B") and int(op[1]) == op[1]
    except Exception:  # noqa: BLE001
        return False


def _is_op_list(ops) -> bool:
    return isinstance(ops, (list, tuple)) and all(_is_op(op) for op in ops)


def _is_event_list(events) -> bool:
    try:
        return isinstance(events, (list, tuple)) and all(
            len(e) == 3 and _is_op(e[0]) and math.isfinite(float(e[1])) and math.isfinite(float(e[2]))
            for e in events)
    except Exception:  # noqa: BLE001
        return False


def _label(op) -> str:
    return f"{op[0]}{int(op[1])}"


def _width(labels) -> int:
    return max([len(x) for x in labels] + [2]) + 1


def _schedule(stages) -> list:
    w = _width([_label(op) for ops in stages for op in ops])
    return [[(f"stage {s} | ", None)] + [(_label(op).ljust(w), _STYLE[str(op[0])]) for op in ops]
            for s, ops in enumerate(stages)]


def _timeline(stages, unit=None) -> list:
    events = [[(e[0], float(e[1]), float(e[2])) for e in stage] for stage in stages]
    durations = [end - start for stage in events for _, start, end in stage if end - start > 1e-12]
    unit = unit or (min(durations) if durations else 1.0)
    w = _width([_label(op) for stage in events for op, _, _ in stage])
    lines = []
    for s, stage in enumerate(events):
        segments, cursor = [(f"stage {s} | ", None)], 0
        for op, start, end in sorted(stage, key=lambda e: e[1]):
            first = max(cursor, round(start / unit))
            last = max(first + 1, round(end / unit))
            if first > cursor:
                segments.append(("".join(".".ljust(w) for _ in range(first - cursor)), _STYLE["idle"]))
            segments.append((_label(op).ljust(w * (last - first)), _STYLE[str(op[0])]))
            cursor = last
        lines.append(segments)
    return lines


def _safe_repr(value) -> str:
    try:
        return repr(value)
    except Exception:  # noqa: BLE001
        return f"<{type(value).__name__}>"


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
