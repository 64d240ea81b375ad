"""A failure in plain words: its kind (what judge.py's table shows), its message, and the case that broke it."""
from __future__ import annotations

import os
import traceback

import harness
from harness import errors

from .judging import NOT_IMPLEMENTED
from .report import relative

_KINDS = (   # most specific first
    ((errors.HangError, errors.HangStopped), "hang"),
    (errors.RankCrashed, "crash"),
    (harness.WrongType, "wrong type"),
    (harness.PropertyFailed, "property"),
    (errors.TraceTampered, "tampered"),
    (errors.TargetError, "load error"),
)
# Failures whose message is the whole story: pytest's traceback of the test process adds nothing.
PLAIN_WORDS = (errors.HarnessError, harness.PropertyFailed, errors.HangStopped, errors.NotImplementedYet,
               errors.TraceTampered)


def first_exception(exc):
    """Hypothesis may raise an ExceptionGroup of several distinct failures: report the first."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def raised_by_stub(frames, target_path: str | None = None) -> bool:
    """The learner's own ``raise NotImplementedError`` in the file under test (an unfinished stub)."""
    if target_path is not None and frames and os.path.basename(frames[-1][0]) != os.path.basename(target_path):
        return False
    return errors.raised_by_stub(frames)


def explain(exc, target_path: str | None = None) -> tuple[str, str]:
    """(kind, message) for a failure."""
    if isinstance(exc, errors.NotImplementedYet):
        if raised_by_stub(exc.frames, target_path):
            return NOT_IMPLEMENTED, str(exc)
        return "error", exc.render()
    for classes, kind in _KINDS:
        if isinstance(exc, classes):
            return kind, str(exc)
    if isinstance(exc, errors.HarnessError):
        return type(exc).__name__, str(exc)
    if isinstance(exc, AssertionError):
        return "property", str(exc) or "assertion failed"
    return "error", f"{type(exc).__name__}: {exc}" + _where_in_tests(exc)


def _where_in_tests(exc) -> str:
    """For an error raised in the test process: the innermost test-file line, so it can be found."""
    ours = (os.path.dirname(harness.__file__), os.path.dirname(os.path.abspath(__file__)))
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" not in f.filename and not f.filename.startswith(ours)]
    if not frames:
        return ""
    f = frames[-1]
    return f"\n  at {relative(f.filename)}:{f.lineno}: {(f.line or '').strip()}"


def case_of(exc, fallback: str) -> str:
    """The case to show: the one the property names, else hypothesis's (shrunk) draw."""
    case = getattr(exc, "case", None)
    if isinstance(case, dict):
        return ", ".join(f"{k}={v!r}" for k, v in case.items())
    return str(case) if case else fallback


def format_draw(kwargs: dict, skip) -> str:
    """A hypothesis draw as text, leaving out fixtures."""
    drawn = {k: v for k, v in kwargs.items() if k not in skip}
    if list(drawn) == ["case"]:   # the problems' usual single ``case`` argument: its value says it all
        return repr(drawn["case"])
    return ", ".join(f"{k}={v!r}" for k, v in drawn.items())


def hypothesis_notes(exc) -> str:
    return "\n".join(getattr(exc, "__notes__", None) or []).strip()
