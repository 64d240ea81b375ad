"""The multi-rank engine under every problem: run code on N real ranks, traced.

Public API -- problems use only these names:

    run(fn, world_size, *args, timeout=, forbid=, allow=, backend=) -> RunResult(values, trace)
    phase(name, step=None)        mark a region inside a rank function
    device()                      this rank's device (cuda:rank under NCCL, else cpu)
    Target, reference_of          the learner's file (loaded inside the ranks); a reference beside a wrong version
    assert_close, check, PropertyFailed      plain-words property checks
    errors: HangError, RankError, NotImplementedYet, RankCrashed, ForbiddenOp, TraceTampered, TargetError
"""
from ._tracer import phase
from .check import PropertyFailed, assert_close, check
from .errors import (ForbiddenOp, HangError, HarnessError, NotImplementedYet, RankCrashed, RankError,
                     TargetError, TraceTampered)
from .runner import RunResult, pick_backend, run, shutdown
from .target import Target, device, reference_of
from .trace import CommOp, PhaseSpan, Trace

__all__ = [
    "run", "RunResult", "phase", "device", "Target", "reference_of", "pick_backend", "shutdown",
    "assert_close", "check", "PropertyFailed",
    "CommOp", "PhaseSpan", "Trace",
    "HarnessError", "HangError", "RankError", "NotImplementedYet", "RankCrashed", "ForbiddenOp",
    "TraceTampered", "TargetError",
]
