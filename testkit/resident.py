"""What a rank holds, measured from outside it: the growth of its resident memory, as the kernel counts it.

The tensor walk (``harness.live_storages``) is exact but runs inside the rank, and sees tensors only:
state kept in numpy arrays, ctypes buffers or mmaps escapes it.  The kernel's count of a rank's
resident pages (``RunResult.memory``, read by the test process) sees everything, at page resolution;
the ranks give the pages of large blocks back when they free them (the harness sets that up), so the
growth over a call is what the call left alive (``harness.hold``).  Use it on sizes of megabytes.
"""
import harness


def _nothing():
    """A call that only lets the last call's held objects go (the rank loop releases them as a call begins)."""


def resident_growth(fn, world_size: int, *args, **kwargs) -> list:
    """Bytes by which each rank's resident memory grew over a call of ``fn``, which passes what it built to
    ``harness.hold``.  It runs three times, each followed by a call that releases what it held: the first
    warms the rank (what code allocates on first use stays resident); of the other two, each rank's smaller
    growth counts (a thread's first allocation can add an arena's pages once; what is held is there each time)."""
    growths = []
    for _ in range(3):
        result = harness.run(fn, world_size, *args, **kwargs)
        harness.run(_nothing, world_size)
        growths.append([reading["end"] - reading["start"] for reading in result.memory])
    return [min(each) for each in zip(*growths[1:])]
