"""Draw a pipeline schedule, or its simulated timeline, as a per-stage grid of text (problem 118).

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
``render_grid`` never raises, so a judge can show whatever a learner's code returned.
``color=True`` adds ANSI colours (forwards green, backwards cyan, idle dim).
``show_for_target(path)`` runs a learner's ``schedule_1f1b`` and ``simulate`` on one
harness rank and returns both drawings (a rich ``Text`` when rich is installed).
"""
from __future__ import annotations

import math

_STYLE = {"F": "green", "B": "cyan", "idle": "dim"}
_ANSI = {"green": "\x1b[32m", "cyan": "\x1b[36m", "dim": "\x1b[2m", "bold": "\x1b[1m"}
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


# ---- the judge's view of a learner's file ------------------------------------------------------------

def _learner_views(target, num_stages, num_microbatches, t_fwd, t_bwd):
    """Runs on one rank: the learner's schedule and its simulated timeline, as plain data or error text."""
    module = target.load()
    out = {}
    try:
        schedule = module.schedule_1f1b(num_stages, num_microbatches)
        out["schedule"] = [[(str(op[0]), int(op[1])) for op in ops] for ops in schedule]
    except Exception as e:  # noqa: BLE001
        out["schedule_error"] = f"{type(e).__name__}: {e}"
        return out
    try:
        result = module.simulate(schedule, t_fwd, t_bwd)
        out["events"] = [[((str(op[0]), int(op[1])), float(a), float(b)) for op, a, b in stage]
                         for stage in result.events]
    except Exception as e:  # noqa: BLE001
        out["events_error"] = f"{type(e).__name__}: {e}"
    return out


def show_for_target(path: str, num_stages: int = 4, num_microbatches: int = 6, t_fwd: float = 1.0,
                    t_bwd: float = 2.0):
    """The learner's ``schedule_1f1b`` and its ``simulate`` timeline, drawn; a message instead if they fail."""
    call = f"schedule_1f1b({num_stages}, {num_microbatches})"
    try:
        from . import Target, run
        views = run(_learner_views, 1, Target(path), num_stages, num_microbatches, t_fwd, t_bwd,
                    timeout=10).values[0]
    except Exception as e:  # noqa: BLE001
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        return _styled([[(f"(cannot draw {call}: {message})", None)]])
    sections = [[(f"{call}, your op lists:", "bold")]]
    if "schedule" in views:
        sections += _lines(views["schedule"])
    else:
        sections.append([(f"  raised {views['schedule_error']}", None)])
        return _styled(sections)
    sections.append([(f"simulate(that, t_fwd={t_fwd:g}, t_bwd={t_bwd:g}), one cell = {t_fwd:g}:", "bold")])
    if "events" in views:
        sections += _lines(views["events"], unit=t_fwd)
    else:
        sections.append([(f"  raised {views['events_error']}", None)])
    return _styled(sections)


def _styled(lines):
    """A rich Text when rich is installed, else plain text."""
    try:
        from rich.text import Text
    except ImportError:
        return "\n".join(_join(line, color=False) for line in lines)
    text = Text()
    for i, line in enumerate(lines):
        if i:
            text.append("\n")
        for k, (piece, style) in enumerate(line):
            text.append(piece.rstrip() if k == len(line) - 1 else piece, style=style)
    return text
