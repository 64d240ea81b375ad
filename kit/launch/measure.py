"""One contender's per-step figures on this rank, and the table rank 0 prints from every rank's.

A contender is one implementation of the workload: ``build()`` makes its model and state and returns
``step(i)``, which runs training step i (or one collective) and returns the seconds it spent blocked
on communication where the tracer cannot see the wait (C++), or None.  Per step, on each rank:

  step      wall time, the ranks lined up by a barrier before it (GPU work included: synchronized)
  sent      bytes this rank handed to communication ops: each send's tensor and each collective's
            input (a broadcast's or scatter's at its root only); what the backend's algorithm then
            puts on the wire differs (a ring all_reduce moves 2(N-1)/N of its input from each rank)
  exposed   time blocked on communication: inside a wait on an op (``Work.wait``, a blocking
            collective, ``wait_tensor``; overlapping waits counted once), plus the C++ waits a
            contender times itself.  Under NCCL a wait only orders the GPU's streams: the CPU
            does not block, and the figure says little
  peak      the most memory the contender held at once, above what the rank held before building it:
            CUDA's allocator peak, or on the CPU the peak resident memory (VmHWM, reset first)

Each is the median over the measured steps (peak: over all of them); the table shows the largest
over ranks (the slowest rank sets the pace), and a ratio row per implementation of yours.
"""
from __future__ import annotations

import ctypes
import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

import harness

WARMUP = 2   # DistributedDataParallel rebuilds its buckets during its second step


@dataclass
class Contender:
    label: str          # "yours  BucketedDDP", "torch  DistributedDataParallel"
    build: Callable     # () -> step(i) -> seconds blocked out of the tracer's sight, or None
    ratio_label: str = "yours / torch"   # its ratio row's label, when it is one of yours


@dataclass
class Comparison:
    torch: Contender
    yours: list = field(default_factory=list)   # of Contender: one row each, and its ratio to torch's


def run(contender: Contender, steps: int, device) -> dict:
    """This rank's figures for ``contender``: ``step_s``, ``sent_bytes``, ``exposed_s``, ``peak_bytes``."""
    memory = _PeakMemory(device)
    step = contender.build()
    times, sent, exposed = [], [], []
    for i in range(WARMUP + steps):
        dist.barrier()
        _synchronize(device)
        with harness.recording() as ops:
            start = time.perf_counter()
            hidden_wait = step(i)
            _synchronize(device)
            seconds = time.perf_counter() - start
        if i >= WARMUP:
            times.append(seconds)
            sent.append(sum(map(sent_bytes, ops)))
            exposed.append(blocked_seconds(ops) + (hidden_wait or 0.0))
    peak = memory.peak()
    del step
    gc.collect()
    return {"step_s": statistics.median(times), "sent_bytes": int(statistics.median(sent)),
            "exposed_s": statistics.median(exposed), "peak_bytes": peak}


def sent_bytes(op) -> int:
    if op.kind == "recv" or (op.kind in ("broadcast", "scatter") and op.root != op.rank):
        return 0
    return op.in_bytes


def blocked_seconds(ops) -> float:
    """The union of the ops' wait spans (a wait inside another wait counts once)."""
    spans = sorted((op.wait_start, op.wait_end) for op in ops if op.wait_start is not None and op.wait_end is not None)
    total, reached = 0.0, float("-inf")
    for start, end in spans:
        total += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return total


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _PeakMemory:
    """The peak above what the rank holds now."""

    def __init__(self, device):
        self.device = device
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.start = torch.cuda.memory_allocated(device)
            return
        _give_freed_memory_back()
        self.start = _status_kib("VmRSS") * 1024
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")   # resets VmHWM to the resident size now (Linux)
        except OSError:
            self.start = None   # no way to reset the peak: report none rather than a wrong one

    def peak(self) -> int | None:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) - self.start
        if self.start is None:
            return None
        return max(0, _status_kib("VmHWM") * 1024 - self.start)


def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field_name + ":"))


_M_MMAP_THRESHOLD = -3   # glibc's mallopt parameter


def resident_memory_follows_tensors():
    """Blocks of 64 KiB and more get pages of their own, returned when freed, so resident memory (the CPU's
    peak figure) follows the tensors a contender holds, not what glibc kept from the one before."""
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, 1 << 16)
    except (OSError, AttributeError):
        pass


def _give_freed_memory_back():
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ---- the table (rank 0) --------------------------------------------------------------------------

COLUMNS = ("step ms", "sent B", "exposed ms", "peak MiB")


def table(comparisons: list, figures: list) -> str:
    """``figures[rank][label]``: each rank's figures.  Rows: yours, torch's, then yours / torch for each of yours."""
    worst = {label: {key: _largest([per_rank[label][key] for per_rank in figures]) for key in figures[0][label]}
             for label in figures[0]}
    rows = []
    for comparison in comparisons:
        base = worst[comparison.torch.label]
        rows += [(c.label, _cells(worst[c.label])) for c in comparison.yours]
        rows.append((comparison.torch.label, _cells(base)))
        rows += [(c.ratio_label, [_ratio(worst[c.label][k], base[k]) for k in _KEYS]) for c in comparison.yours]
        rows.append(None)
    width = max(len(label) for label, _ in filter(None, rows))
    lines = [" " * width + "".join(f"{c:>13}" for c in COLUMNS)]
    for row in rows[:-1]:
        lines.append("" if row is None else row[0].ljust(width) + "".join(f"{cell:>13}" for cell in row[1]))
    return "\n".join(lines)


_KEYS = ("step_s", "sent_bytes", "exposed_s", "peak_bytes")


def _largest(values):
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _cells(f: dict) -> list:
    peak = "n/a" if f["peak_bytes"] is None else f"{f['peak_bytes'] / 2**20:.1f}"
    return [f"{f['step_s'] * 1e3:.2f}", str(f["sent_bytes"]), f"{f['exposed_s'] * 1e3:.2f}", peak]


def _ratio(mine, base) -> str:
    if mine is None or base is None or base == 0:
        return "-"
    return f"{mine / base:.2f}x"
