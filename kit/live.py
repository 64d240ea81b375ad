"""Live progress on a terminal while a test run goes: which test, which example, how many tests are done."""
from __future__ import annotations

import sys

from . import report


class LiveProgress:
    """On a terminal: which test is running, which example, and how many tests are done (rich progress).

    Without a terminal (a pipe, a file, CI, grading) it shows nothing at all.
    """

    def __init__(self, enabled: bool, what: str):
        self.enabled, self.what = enabled, what
        self.bar = self.task = None
        self.done = 0

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                                TextColumn("{task.completed}/{task.total} tests"), TimeElapsedColumn(),
                                console=report.console(), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task(f"{self.what}: starting", total=None)
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, event: dict):
        if self.bar is None:
            return
        kind = event.get("event")
        if kind == "phase":
            self.bar.update(self.task, description=f"{self.what}: {event.get('text', '')}")
        elif kind == "collected":
            self.bar.update(self.task, total=event.get("count") or None)
        elif kind == "start":
            self.bar.update(self.task, description=f"{self.what}: {event.get('test', '')}")
        elif kind == "example":
            if event.get("phase") == "shrinking":
                text = f"{event['test']}: failed; shrinking to the smallest case (try {event['n']})"
            else:
                text = f"{event['test']}: example {event['n']} of about {event['of']}"
            self.bar.update(self.task, description=f"{self.what}: {text}")
        elif kind == "end":
            self.done += 1
            self.bar.update(self.task, completed=self.done)


def live(args, what: str) -> LiveProgress:
    return LiveProgress(sys.stdout.isatty() and args.format == "text" and not args.output, what)
