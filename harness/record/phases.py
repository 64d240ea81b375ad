"""``phase(name, step)``: mark a region of a rank function; every op issued inside carries its name and step."""
from __future__ import annotations

from contextlib import contextmanager

from .recorder import active


@contextmanager
def phase(name: str, step: int | None = None):
    """Mark a region of a rank function, e.g. ``with phase("backward", step=k): loss.backward()``.

    Every op issued inside carries the innermost phase's name and step.
    """
    recorder = active()
    if recorder is None:
        yield
        return
    span = {"rank": recorder.rank, "name": name, "step": step, "start": recorder.now(), "end": None}
    recorder.phases.append(span)
    recorder.phase_stack.append(span)
    index = len(recorder.phases) - 1
    recorder.flight(ev="phase", k=index, span=dict(span))
    try:
        yield
    finally:
        recorder.phase_stack.remove(span)
        span["end"] = recorder.now()
        recorder.flight(ev="phase", k=index, span=dict(span))
