"""A folder the ranks share on request, and a rank killed on purpose in the middle of its file writes.

Checkpointing (problem 125) needs both: every rank writes its part of a checkpoint into one folder
that a later world, of another size, reads; and a test must show that a rank dying mid-save leaves
the previous checkpoint usable.  The kill is the test's own fault, so the call returns normally with
``RunResult.killed`` set; any other death is still the learner's crash.
"""
import os
import time

import pytest
import torch
import torch.distributed as dist

import harness
from harness import pool, sandbox as _sandbox

from tests.harness_helpers import rank_pid

TIMEOUT = 30


def save_parts(folder: str, tag: str):
    """Each rank writes its part through a temporary name, and rank 0 commits after a barrier."""
    rank = dist.get_rank()
    step = os.path.join(folder, tag)
    os.makedirs(step, exist_ok=True)                                     # event 1 (mkdir)
    torch.save({"rank": rank}, os.path.join(step, f"part{rank}.tmp"))     # event 2
    os.replace(os.path.join(step, f"part{rank}.tmp"), os.path.join(step, f"part{rank}.pt"))   # event 3
    dist.barrier()
    if rank == 0:
        with open(os.path.join(step, "COMMIT"), "w") as f:                # rank 0's event 4
            f.write("done")
    return os.getpid()


def listing(folder: str, tag: str):
    path = os.path.join(folder, tag)
    return sorted(os.listdir(path)) if os.path.isdir(path) else None


def crash_on_rank_0(folder: str):
    if dist.get_rank() == 0:
        os._exit(3)
    return save_parts(folder, "crash")


def test_ranks_share_the_folder_across_worlds_of_different_sizes(tmp_path):
    harness.run(save_parts, 3, str(tmp_path), "a", probes=[harness.SharedFolder(str(tmp_path))], timeout=TIMEOUT)
    assert harness.run(listing, 2, str(tmp_path), "a", probes=[harness.SharedFolder(str(tmp_path))], timeout=TIMEOUT).values == \
        [["COMMIT", "part0.pt", "part1.pt", "part2.pt"]] * 2


@pytest.mark.skipif(isinstance(_sandbox.landlock_abi(), str), reason="no Landlock here: ranks are not confined")
def test_without_a_shared_folder_the_folder_stays_closed(tmp_path):
    with pytest.raises(harness.RankError, match="Permission denied"):
        harness.run(save_parts, 2, str(tmp_path), "b", timeout=TIMEOUT)


@pytest.mark.parametrize("event, left_behind", [
    (1, ["part0.pt", "part2.pt"]),                  # before its mkdir (another rank made the folder)
    (2, ["part0.pt", "part2.pt"]),                  # before its torch.save
    (3, ["part0.pt", "part1.tmp", "part2.pt"]),     # after the save, before the rename
])
def test_a_kill_mid_save_is_the_tests_own_fault(tmp_path, event, left_behind):
    result = harness.run(save_parts, 3, str(tmp_path), "c", timeout=TIMEOUT,
                         probes=[harness.SharedFolder(str(tmp_path)), harness.KillAt(rank=1, event=event)])
    assert result.killed is not None and result.killed.rank == 1, result.killed
    assert f"file event {event}:" in result.killed.event, result.killed.event
    # the open torch.save makes is the one event that names a file being written
    assert result.killed.written == (f"{tmp_path.name}/c/part1.tmp" if event == 2 else None), result.killed
    assert result.values[1] is None
    assert harness.run(listing, 1, str(tmp_path), "c", probes=[harness.SharedFolder(str(tmp_path))], timeout=TIMEOUT).values == \
        [left_behind], "no COMMIT: rank 0 never got past the barrier"


def save_then_gather_digests(folder: str):
    """Each rank writes its part, then the ranks exchange what they wrote with an object collective (as a save
    that gathers its shards' digests does, or torch.distributed.checkpoint inside)."""
    rank = dist.get_rank()
    with open(os.path.join(folder, f"part{rank}"), "w") as f:      # event 1
        f.write(str(rank))
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, {"rank": rank})
    return digests


def test_a_kill_before_an_object_collective_ends_the_call_within_its_time_limit(tmp_path):
    """#24: a rank killed while the others wait in all_gather_object; the call ends as any other death does."""
    started = time.monotonic()
    result = harness.run(save_then_gather_digests, 3, str(tmp_path), timeout=TIMEOUT,
                         probes=[harness.SharedFolder(str(tmp_path)), harness.KillAt(rank=1, event=1)])
    assert result.killed is not None and result.killed.rank == 1, result.killed
    assert time.monotonic() - started < TIMEOUT, "the call waited out its time limit"


def test_a_kill_that_never_comes_leaves_an_ordinary_call(tmp_path):
    result = harness.run(save_parts, 2, str(tmp_path), "d", timeout=TIMEOUT,
                         probes=[harness.SharedFolder(str(tmp_path)), harness.KillAt(rank=1, event=99)])
    assert result.killed is None and None not in result.values
    assert len(result.trace.ops(0, "barrier")) == 1


def test_the_world_of_a_kill_call_is_never_reused(tmp_path):
    result = harness.run(save_parts, 2, str(tmp_path), "e", timeout=TIMEOUT,
                         probes=[harness.SharedFolder(str(tmp_path)), harness.KillAt(rank=1, event=99)])
    after = harness.run(rank_pid, 2, probes=[harness.SharedFolder(str(tmp_path))], timeout=TIMEOUT).values
    assert not set(result.values) & set(after), "the ranks that carried an armed kill served another call"


def test_another_death_in_a_kill_call_is_still_a_crash(tmp_path):
    with pytest.raises(harness.RankCrashed, match="rank 0"):
        harness.run(crash_on_rank_0, 2, str(tmp_path), timeout=TIMEOUT,
                    probes=[harness.SharedFolder(str(tmp_path)), harness.KillAt(rank=1, event=99)])


def test_bad_arguments_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="existing folder"):
        harness.SharedFolder(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="SharedFolder"):
        harness.run(listing, 1, str(tmp_path), "x", probes=[harness.KillAt(rank=0, event=1)])
    with pytest.raises(ValueError, match="event"):
        harness.KillAt(rank=0, event=0)


def test_a_new_shared_folder_replaces_the_old_folders_world(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir(), second.mkdir()
    old = harness.run(rank_pid, 2, probes=[harness.SharedFolder(str(first))], timeout=TIMEOUT).values
    harness.run(rank_pid, 2, probes=[harness.SharedFolder(str(second))], timeout=TIMEOUT)
    assert not set(old) & set(pool.live_rank_pids()), "each test's folder would keep a world of ranks alive"
