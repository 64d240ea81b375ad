"""What a rank function keeps alive past its call's end: ``hold(*objects)``, released as the next call begins.

The call's resident memory at its end (``RunResult.memory``: the kernel's count, read by the test process)
then includes all the held objects hold, tensors or not (``testkit.resident``).
"""
from __future__ import annotations

import gc


_HELD: list = []


def hold(*objects):
    """Keep ``objects`` alive in this rank past the call's end, until the next call begins: the call's resident
    memory at its end (``RunResult.memory``, the kernel's count, read by the test process) then includes all
    they hold, tensors or not.  The next call's own reading starts with them still held."""
    _HELD.extend(objects)


def release_held():
    """The rank loop, as a call begins: what the last call held goes."""
    if _HELD:
        _HELD.clear()
        gc.collect()   # what they held may be cycles (an optimizer and its parameters)
