"""Crashes and hangs become plain reports within the timeout, and the pool recovers from each."""
import ctypes
import mmap
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

import harness
from tests.harness_helpers import assert_fresh_world_works, pids, sum_of_ranks

HANG_TIMEOUT = 2.0
SLACK = 2.0       # the bound: a hang is reported within timeout + 2 s, on a machine with a core to spare


def slack() -> float:
    """SLACK, stretched by how oversubscribed the cores are now: reading each rank's stack after the deadline
    waits for CPU like everything else (4.1 s past a 2 s limit at load 7.5 on 2 cores, in a fresh clone)."""
    return SLACK * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def _other():
    return 1 - dist.get_rank()


def _all_reduce_once():
    t = torch.ones(2)
    dist.all_reduce(t)


# ---- crashes ------------------------------------------------------------------------------------

def exit_on_rank_1():
    if dist.get_rank() == 1:
        print("rank 1 says goodbye", file=__import__("sys").stderr, flush=True)
        os._exit(3)
    _all_reduce_once()


def segfault_on_rank_0_by_signal():
    if dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGSEGV)
    _all_reduce_once()


def segfault_on_rank_1_by_null_read():
    if dist.get_rank() == 1:
        ctypes.string_at(0)
    _all_reduce_once()


def send_more_than_the_peer_receives():
    if dist.get_rank() == 0:
        dist.send(torch.ones(8), 1)
    else:
        dist.recv(torch.ones(4), 0)   # gloo aborts: "Received data size doesn't match expected size"


@pytest.mark.parametrize("fn, rank, how", [
    (exit_on_rank_1, 1, "exited with code 3"),
    (segfault_on_rank_0_by_signal, 0, "was killed by SIGSEGV"),
    (segfault_on_rank_1_by_null_read, 1, "was killed by SIGSEGV"),
    (send_more_than_the_peer_receives, 1, "was killed by SIGABRT: gloo found a size mismatch"),
], ids=["os_exit", "sigsegv_kill", "sigsegv_ctypes", "sigabrt_gloo_size_mismatch"])
def test_a_dying_rank_is_reported_with_its_signal_or_code(fn, rank, how):
    before = pids(2)
    start = time.monotonic()
    with pytest.raises(harness.RankCrashed) as info:
        harness.run(fn, 2, timeout=HANG_TIMEOUT)
    assert time.monotonic() - start < HANG_TIMEOUT, "a crash must not wait for the timeout"
    err = info.value
    assert err.rank == rank and str(err).startswith(f"rank {rank} {how}"), str(err)
    if fn is exit_on_rank_1:
        assert err.exitcode == 3 and "rank 1 says goodbye" in err.stderr_tail and "goodbye" in str(err)
    elif fn is send_more_than_the_peer_receives:
        assert err.exitcode == -signal.SIGABRT and "Received data size" in err.stderr_tail
    else:
        assert err.exitcode == -signal.SIGSEGV
    assert_fresh_world_works(2, before)



def allocate_a_shape_off_by_a_large_factor():
    return torch.ones(2**30).sum().item()   # 4 GB in one allocation


def map_without_bound():
    """Shared anonymous memory, which the kernel's data limit does not count: only the watchdog sees it."""
    hoard = []
    while True:
        hoard.append(mmap.mmap(-1, 2**27))
        hoard[-1].write(b"x" * 2**27)


def test_the_kernel_refuses_an_allocation_past_the_limit_at_once():
    with harness.defaults(memory_gb=0.5):
        start = time.monotonic()
        with pytest.raises(harness.RankError, match=r"can't allocate memory|MemoryError"):
            harness.run(allocate_a_shape_off_by_a_large_factor, 2, timeout=60)
        assert time.monotonic() - start < 30, "the limit should refuse the allocation long before the timeout"
        assert harness.run(sum_of_ranks, 2, timeout=30).values == [1.0, 1.0]   # the world still works


def test_the_memory_guard_ends_a_rank_whose_resident_memory_passes_the_limit():
    with harness.defaults(memory_gb=0.5):
        before = pids(2)
        start = time.monotonic()
        with pytest.raises(harness.RankCrashed, match=r"rank [01] used \d+\.\d+ GB \(limit 0\.5 GB\)") as info:
            harness.run(map_without_bound, 2, timeout=60)
        assert time.monotonic() - start < 30, "the guard should end the rank long before the call's timeout"
        assert "allocates without bound" in str(info.value)
        assert_fresh_world_works(2, before)   # the next call works, on a fresh world


def test_a_rank_that_dies_while_starting_says_why():
    with pytest.raises(harness.RankCrashed, match=r"rank 0 failed to start: exited with code 1") as info:
        harness.run(_all_reduce_once, 1, backend="no_such_backend", timeout=30)
    assert "no_such_backend" in str(info.value), str(info.value)   # its stderr, not a bare EOFError
    assert harness.run(_all_reduce_once, 1, timeout=30).values == [None]


# ---- hangs --------------------------------------------------------------------------------------

def recv_recv():
    t = torch.zeros(2)
    dist.recv(t, _other())
    dist.send(t, _other())


def send_send():
    t = torch.ones(2)
    dist.send(t, _other())
    dist.recv(t, _other())


def mismatched_kinds():
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, 0)


def skip_on_rank_1():
    t = torch.ones(2)
    if dist.get_rank() != 1:
        dist.all_reduce(t)


def endless_loop_on_rank_1():
    if dist.get_rank() == 1:
        while True: pass  # noqa: E701  (one line, so the stack shows one line whichever opcode runs)
    _all_reduce_once()


def group_work_then_recv_recv():
    rank = dist.get_rank()
    low, high = dist.new_group([0, 1]), dist.new_group([2, 3])
    t = torch.ones(2)
    if rank < 2:   # each pair runs its own collectives: different kinds in different groups is fine
        dist.all_reduce(t, group=low)
        dist.recv(t, 1 - rank)
    else:
        dist.broadcast(t, 2, group=high)


def _line_of(fn, text: str) -> int:
    import inspect
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


HANGS = {   # name: (fn, world size, diagnosis, {rank: (function, source line) it blocks at}, also in the report)
    "p2p_recv_recv": (recv_recv, 2, "ranks 0 and 1 both wait in recv(): p2p deadlock",
                      {0: (recv_recv, "dist.recv(t, _other())"), 1: (recv_recv, "dist.recv(t, _other())")},
                      ["last comm op: #1 recv peer 1 at", "last comm op: #1 recv peer 0 at"]),
    "p2p_send_send": (send_send, 2, "ranks 0 and 1 both wait in a blocking send()",
                      {0: (send_send, "dist.send(t, _other())"), 1: (send_send, "dist.send(t, _other())")},
                      ["last comm op: #1 send peer 1 at"]),
    "mismatched_collectives": (mismatched_kinds, 2, "rank 1's 3rd collective is broadcast",
                               {0: (mismatched_kinds, "        dist.all_reduce(t)"),
                                1: (mismatched_kinds, "dist.broadcast(t, 0)")},
                               ["last comm op: #3 all_reduce at", "last comm op: #3 broadcast at"]),
    "skipped_collective": (skip_on_rank_1, 3, "which rank 1 never issued",
                           {0: (skip_on_rank_1, "dist.all_reduce(t)"), 2: (skip_on_rank_1, "dist.all_reduce(t)")},
                           ["rank 1 finished the call", "ranks still running: 0 and 2)"]),
    "endless_loop": (endless_loop_on_rank_1, 2, "rank 1 never got there: it is not inside a communication op",
                     {0: (_all_reduce_once, "dist.all_reduce(t)"), 1: (endless_loop_on_rank_1, "while True: pass")},
                     ["an endless loop?"]),
    "p2p_after_subgroup_collectives": (group_work_then_recv_recv, 4, "ranks 0 and 1 both wait in recv()",
                                       {0: (group_work_then_recv_recv, "dist.recv(t, 1 - rank)"),
                                        1: (group_work_then_recv_recv, "dist.recv(t, 1 - rank)")},
                                       ["rank 2 finished the call", "rank 3 finished the call"]),
}


@pytest.mark.parametrize("name", list(HANGS))
def test_a_hang_is_diagnosed_within_the_timeout(name):
    fn, world_size, diagnosis, blocked, also = HANGS[name]
    before = pids(world_size)
    start = time.monotonic()
    with pytest.raises(harness.HangError) as info:
        harness.run(fn, world_size, timeout=HANG_TIMEOUT)
    elapsed = time.monotonic() - start
    assert HANG_TIMEOUT <= elapsed < HANG_TIMEOUT + slack(), elapsed
    err = info.value
    assert diagnosis in (err.diagnosis or ""), str(err)
    assert f"diagnosis: {err.diagnosis}" in str(err)
    assert err.timeout == HANG_TIMEOUT and f"within {HANG_TIMEOUT:g} s" in str(err)
    for rank, (where_fn, source) in blocked.items():
        expected = f"test_harness_failures.py:{_line_of(where_fn, source)} in {where_fn.__name__}: {source.strip()}"
        assert expected in (err.where[rank] or ""), (rank, err.where[rank])
        assert f"rank {rank} is blocked at: {err.where[rank]}" in str(err)
    for text in also:
        assert text in str(err), text
    assert_fresh_world_works(world_size, before)
