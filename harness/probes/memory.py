"""``ResidentMemory``: each rank's resident memory, read by the test process from /proc (the kernel's own
accounting), at the call's start, at its peak and at its end.  The peak is the kernel's high-water mark
(VmHWM, reset to the resident size as the call starts, through /proc/PID/clear_refs), which sees a block
that lived between two watchdog ticks; where the reset is refused, the highest tick.

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


def reset_peak(pid: int) -> bool:
    """Set a process's high-water mark to its resident size now (clear_refs' 5); False where refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes(pid: int) -> int:
    """A process's high-water mark of resident memory, from /proc (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return 0


class ResidentMemory(Probe):
    name = "memory"

    def start(self, world):
        self.marked = [reset_peak(pid) for pid in world.pids()]   # before the readings: no page is missed
        self.readings = [{"start": b, "peak": b, "end": b} for b in map(resident_bytes, world.pids())]

    def tick(self, world):
        for reading, now in zip(self.readings, map(resident_bytes, world.pids())):
            reading["peak"] = max(reading["peak"], now)

    def finish(self, world, call):
        self.tick(world)
        for reading, marked, pid in zip(self.readings, self.marked, world.pids()):
            reading["end"] = resident_bytes(pid)
            if marked:
                reading["peak"] = max(reading["peak"], peak_bytes(pid))
        return self.readings
