"""A failure in plain words: its kind (what judge.py's table shows), its message, and the case that broke it."""
from __future__ import annotations

import os
import re
import traceback

import harness
from harness import errors

from .judging import NOT_IMPLEMENTED
from .report import LOAD_ERROR, relative

_KINDS = (   # most specific first
    ((errors.HangError, errors.HangStopped), "hang"),
    (errors.RankCrashed, "crash"),
    (harness.WrongType, "wrong type"),
    (harness.PropertyFailed, "property"),
    (errors.TraceTampered, "tampered"),
    (errors.TargetError, LOAD_ERROR),
)
# Failures whose message is the whole story: pytest's traceback of the test process adds nothing.
PLAIN_WORDS = (errors.HarnessError, harness.PropertyFailed, errors.HangStopped, errors.NotImplementedYet,
               errors.TraceTampered)


# What importing the file under test on a rank can raise: each is a load error (kit.plugin)
IMPORT_FAILURES = (errors.RankError, errors.NotImplementedYet, errors.RankCrashed, errors.HangError,
                   errors.HangStopped)
# A rank that ran out of memory: the harness's watchdog ended it, or an allocation was refused
_OVER_MEMORY = re.compile(r"used [\d.]+ GB \(limit [\d.]+ GB\)")
_ALLOCATION_REFUSED = re.compile(r"can't allocate memory|out of memory|Cannot allocate memory", re.I)
# Ranks that never got as far as learner code: the machine's trouble, not the submission's
_NOT_STARTED = re.compile(r"^rank \d+ (failed to start|did not start within)")
INTERNAL = "internal error"


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
    if out_of_memory(exc):
        return "memory", str(exc)
    if isinstance(exc, EOFError) or isinstance(exc, errors.RankCrashed) and _NOT_STARTED.match(str(exc)):
        # e.g. multiprocessing's "EOFError: Ran out of input" when a loaded machine loses a rank being started
        return INTERNAL, (f"the harness could not start the ranks ({type(exc).__name__}: {exc}); this is not "
                          "the code under test, which had not run yet: run the judge again")
    for classes, kind in _KINDS:
        if isinstance(exc, classes):
            return kind, str(exc)
    if isinstance(exc, errors.HarnessError):
        return type(exc).__name__, str(exc)
    if isinstance(exc, AssertionError):
        return "property", str(exc) or "assertion failed"
    return "error", f"{type(exc).__name__}: {exc}" + _where_in_tests(exc)


def out_of_memory(exc) -> bool:
    """A rank ended for its memory: by the harness's watchdog (RankCrashed), or by an allocation the
    kernel refused (a per-rank data limit: MemoryError, or torch's "can't allocate memory")."""
    if isinstance(exc, errors.RankCrashed):
        return bool(_OVER_MEMORY.search(str(exc)))
    if isinstance(exc, errors.RankError):
        return exc.exc_type in ("MemoryError", "OutOfMemoryError") or bool(_ALLOCATION_REFUSED.search(exc.exc_message))
    return False


def import_failure(path: str, exc) -> str:
    """Why importing the file under test failed on a rank, in one message: what it raised, and where."""
    if isinstance(exc, errors.HangStopped):
        exc = exc.hang
    if isinstance(exc, errors.HangError):
        return f"importing {path} did not finish within {exc.timeout:g} s: " + "; ".join(
            f"rank {r} at {where}" for r, where in sorted(exc.where.items()))
    if isinstance(exc, errors.RankCrashed):
        return f"importing {path} killed the rank: {str(exc).strip()}"
    message = f"importing {path} raised {exc.exc_type}: {exc.exc_message}"
    mine = [f for f in exc.frames if os.path.basename(f[0]) == os.path.basename(path)]
    if mine:
        file, line, _, source = mine[-1]
        message += f"\n  at {os.path.basename(file)}:{line}" + (f": {source}" if source else "")
    return message


def shortened_limit(budget: float, time_limit: float) -> str:
    return (f"\n  (this call had {budget:g} s, not the problem's {time_limit:g} s: an earlier test of the same "
            "code hung, so later ones are given less time)")


def remember_case(exc: BaseException, case: str) -> None:
    """Keep the case on the exception it raised: with several distinct failures, hypothesis reports each
    one's own exception, so each shows its own case (not the last one drawn)."""
    try:
        exc._kit_case = case
    except AttributeError:
        pass


def case_remembered(exc) -> str:
    return getattr(exc, "_kit_case", "") or ""


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
