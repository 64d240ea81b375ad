"""``ResidentMemory``: each rank's resident memory, read by the test process from /proc (the kernel's own
accounting), at the call's start, at its peak (every watchdog tick) and at its end.

Every call runs it, whatever it asks for: a rank cannot tell, and cannot hide what it holds (numpy
arrays, ctypes buffers, mmaps count like tensors).  Its resolution is a page, and the allocator keeps
freed memory for a while: use it on sizes of megabytes, beside ``harness.live_storages`` (exact, but
inside the rank).  ``RunResult.probes["memory"]``: per rank, {"start", "peak", "end"} in bytes.
"""
from __future__ import annotations

import os

from .base import Probe

_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(pid: int) -> int:
    """A process's resident set size, from /proc (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class ResidentMemory(Probe):
    name = "memory"

    def start(self, world):
        self.readings = [{"start": b, "peak": b, "end": b} for b in map(resident_bytes, world.pids())]

    def tick(self, world):
        for reading, now in zip(self.readings, map(resident_bytes, world.pids())):
            reading["peak"] = max(reading["peak"], now)

    def finish(self, world, call):
        self.tick(world)
        for reading, now in zip(self.readings, map(resident_bytes, world.pids())):
            reading["end"] = now
        return self.readings
