"""What the harness raises in the test process when a call on the ranks goes wrong.

Every message is meant to be read by a learner: it names the rank, the place in
their code, and what went wrong in plain words.
"""
from __future__ import annotations


class HarnessError(Exception):
    """Base of everything ``harness.run`` raises about the ranks."""


class _RankFailure:
    """Code on a rank raised.  ``frames`` are (file, line, function, source) of the code under test."""

    def __init__(self, rank: int, exc_type: str, message: str, frames: list, world_size: int = 0):
        self.rank, self.exc_type, self.exc_message, self.frames = rank, exc_type, message, frames
        self.world_size = world_size
        super().__init__(self._summary())

    def render(self) -> str:
        """The whole report: which rank raised what, and each frame of the code under test."""
        lines = [f"rank {self.rank} raised {self.exc_type}: {self.exc_message}"]
        for file, line, func, source in self.frames:
            lines.append(f'  File "{file}", line {line}, in {func}')
            if source:
                lines.append(f"    {source}")
        return "\n".join(lines)

    def _summary(self) -> str:
        """The exception's message (``str(exc)``): the whole report, unless a subclass says less."""
        return self.render()


class RankError(_RankFailure, HarnessError):
    """Code on a rank raised.  ``frames`` are (file, line, function, source) of the code under test."""


class NotImplementedYet(_RankFailure, BaseException):
    """The learner's stub still raises NotImplementedError.

    A BaseException on purpose: hypothesis then stops at once instead of
    shrinking (every input fails the same way), and the test reports it.
    """

    @property
    def location(self) -> str:
        file, line, func, _ = self.frames[-1] if self.frames else ("?", 0, "?", "")
        return f"{file}:{line} ({func})"

    def _summary(self) -> str:
        return f"not implemented yet: {self.location}"


class ForbiddenOp(HarnessError):
    """Raised on a rank when code issues an op the call's policy forbids."""


class TraceTampered(BaseException):
    """Something removed or bypassed the harness's tracer on a rank.

    A BaseException, like NotImplementedYet: hypothesis stops at once rather than
    shrinking something no input causes.
    """


class RankCrashed(HarnessError):
    """A rank process died: a signal, ``os._exit``, or an abort inside gloo."""

    def __init__(self, message: str, rank: int, exitcode: int | None, stderr_tail: str):
        self.rank, self.exitcode, self.stderr_tail = rank, exitcode, stderr_tail
        super().__init__(message)


class HangError(HarnessError):
    """The ranks did not finish within the call's timeout.

    ``where`` maps rank -> its innermost user frame ("file:line  source"),
    ``diagnosis`` is a one-line explanation when the pattern is recognised.
    """

    def __init__(self, message: str, where: dict, diagnosis: str | None, timeout: float):
        self.where, self.diagnosis, self.timeout = where, diagnosis, timeout
        super().__init__(message)


class TargetError(HarnessError):
    """The learner's file cannot be used: missing, a syntax error, or required names absent."""


class BackendUnavailable(HarnessError):
    """The backend asked for cannot run a world of this size here (NCCL needs one GPU per rank)."""


class WorldSkipped(HarnessError):
    """A call of a world size that ``harness.defaults(world_sizes=...)`` leaves out: the example is skipped."""


class HangStopped(BaseException):
    """A HangError raised past hypothesis: shrinking a hang costs one timeout per attempt."""

    def __init__(self, hang: HangError):
        self.hang = hang
        super().__init__(str(hang))


def raised_by_stub(frames) -> bool:
    """True when the innermost user frame is the stub's own ``raise NotImplementedError`` (one raised
    inside torch, say, is an ordinary error)."""
    return bool(frames) and "raise NotImplementedError" in (frames[-1][3] or "")
