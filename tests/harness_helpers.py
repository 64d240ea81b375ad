"""Shared by the harness's own tests: small rank functions and process checks.

Rank functions here are imported by name inside the ranks (the repository root is on
their sys.path); the ones in the test files themselves travel by value.
"""
import os

import torch
import torch.distributed as dist

import harness
from harness import pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rank_pid():
    return os.getpid()


def pids(world_size: int) -> list:
    """The pids of the pooled world of this size, asked of the ranks themselves."""
    return harness.run(rank_pid, world_size, timeout=30).values


def sum_of_ranks():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()


def assert_fresh_world_works(world_size: int, old_pids: list):
    """After a failure the next call works, on new rank processes; the old ones are gone."""
    new = pids(world_size)
    assert not set(new) & set(old_pids), f"the failed world was reused: {old_pids} -> {new}"
    assert harness.run(sum_of_ranks, world_size, timeout=30).values == [world_size * (world_size - 1) / 2] * world_size
    assert not any(_alive(p) for p in old_pids), "a rank of the failed world is still alive"
    assert sorted(pool.live_rank_pids()) == sorted(set(pool.live_rank_pids()))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def source_at(site: str) -> str:
    """The source line a trace ``site`` ("file:line") points at."""
    import linecache
    file, line = site.rsplit(":", 1)
    return linecache.getline(os.path.abspath(file), int(line)).strip()
