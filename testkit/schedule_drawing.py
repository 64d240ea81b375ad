"""A pipeline schedule drawn as text: what a schedule test's failure shows, and the drawing judge.py --show prints.

    ScheduleText(row, label)      .render(rows, unit=None): one line per stage (or rank), an op list as it is
                                  or a timeline of (op, start, end) on a time axis; .both(got, want): the learner's
                                  and the expected, one under the other.  Never raises.
    record_drawing(record_property, draw)    the test's "drawing" property: ``draw()``'s text, or why there is none

Problems 122 and 130 draw their oracles' schedules with ``ScheduleText``; 118, 122 and 130 record their drawing
with ``record_drawing``.  The score never depends on a drawing.
"""
from __future__ import annotations

import harness


class ScheduleText:
    """``row``: what a line is ("stage", "rank"); ``label(op)``: an op's text ("F0", "F0.1")."""

    def __init__(self, row: str, label):
        self.row, self.label = row, label

    def render(self, rows, unit=None) -> str:
        """One line per stage.  Op lists as they are; (op, start, end) rows on a time axis, one cell per ``unit``
        (the shortest op by default), '.' where the stage idles.  Anything else comes out as its repr."""
        try:
            timed = any(rows) and all(len(e) == 3 and not isinstance(e[0], str) for row in rows for e in row)
            lines = self._on_time_axis(rows, unit) if timed else [" ".join(map(self.label, row)) for row in rows]
            return "\n".join(f"{self.row} {s} | {line}".rstrip() for s, line in enumerate(lines))
        except Exception:  # noqa: BLE001 -- a drawing must never take a test down
            text = repr(rows)
            return text if len(text) < 400 else text[:397] + "..."

    def both(self, got, want) -> str:
        return f"\nyours:\n{self.render(got)}\nexpected:\n{self.render(want)}"

    def _on_time_axis(self, rows, unit) -> list:
        unit = unit or min(b - a for row in rows for _, a, b in row if b > a)
        width = 1 + max(len(self.label(op)) for row in rows for op, _, _ in row)
        lines = []
        for row in rows:
            text, cell = "", 0
            for op, a, b in row:
                first = max(cell, round(a / unit))
                text += ".".ljust(width) * (first - cell)
                cell = max(first + 1, round(b / unit))
                text += self.label(op).ljust(width * (cell - first))
            lines.append(text)
        return lines


def record_drawing(record_property, draw) -> None:
    """``draw()`` runs the learner's code and returns the drawing's text; where the run itself fails (not
    implemented yet, a hang, a harness error) the drawing says so instead.  judge.py --show prints it."""
    try:
        text = draw()
    except (harness.HarnessError, harness.HangStopped, harness.NotImplementedYet) as e:
        text = f"(no drawing: {str(e).splitlines()[0]})"
    record_property("drawing", text)
