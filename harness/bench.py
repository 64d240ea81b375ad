"""How fast is a harness call?  ``python -m harness.bench [--calls 200] [--spawn-calls 3] [--spawn-sizes 2,4]``

Prints, in one run:
  * the cold first call (forkserver start with torch preloaded, then a fresh world of 2 ranks);
  * for N=2 and N=4, the median per-call overhead of ``harness.run`` on a trivial all_reduce:
    the median time of a whole call minus the median time of the same function run inside
    the ranks (measured in one call that loops it);
  * the same work done the way most course kits do it: ``torch.multiprocessing.spawn`` with a
    fresh process group for every call (a handful of calls: each costs seconds).
The last line is machine-readable:
  overhead_ms_n2=<x> overhead_ms_n4=<y> speedup_vs_spawn_n4=<z>
where the speedup is the median spawn-per-call time over the median harness call time, at N=4.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def trivial_all_reduce():
    import torch
    import torch.distributed as dist
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def in_rank_seconds(repeats: int) -> list:
    """Each time of ``trivial_all_reduce`` inside a rank, looped within one call."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        trivial_all_reduce()
        times.append(time.perf_counter() - start)
    return times


def _spawned_rank(rank: int, world_size: int, init_file: str):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
    dist.destroy_process_group()


def spawn_call(world_size: int) -> float:
    """One call the spawn-a-group-per-call way: fresh processes, fresh torch import, fresh group."""
    import torch.multiprocessing as tmp
    folder = tempfile.mkdtemp(prefix="bench-spawn-")
    start = time.perf_counter()
    tmp.spawn(_spawned_rank, args=(world_size, os.path.join(folder, "init")), nprocs=world_size, join=True)
    elapsed = time.perf_counter() - start
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)
    return elapsed


def harness_overhead(run, world_size: int, calls: int) -> tuple[float, float, float]:
    """(median call s, median in-rank s, overhead s) for a trivial all_reduce on a warm world."""
    for _ in range(min(10, calls)):   # warm: the function is shipped once per world
        run(trivial_all_reduce, world_size, timeout=60)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run(trivial_all_reduce, world_size, timeout=60)
        times.append(time.perf_counter() - start)
    in_rank = statistics.median(t for times in run(in_rank_seconds, world_size, calls, timeout=120).values
                                for t in times)
    call = statistics.median(times)
    return call, in_rank, call - in_rank


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="harness calls per world size (default 200)")
    parser.add_argument("--spawn-calls", type=int, default=3, help="spawn-per-call calls per world size (default 3)")
    parser.add_argument("--spawn-sizes", default="2,4", choices=["2,4", "4"],
                        help="world sizes for the spawn baseline (default 2,4; 4 alone saves time)")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import torch  # noqa: F401  (as in a test process: the caller has torch loaded)
    from .pool import run, shutdown
    print(f"import torch and harness.pool (the caller's side): {time.perf_counter() - start:.2f} s", flush=True)

    start = time.perf_counter()
    run(trivial_all_reduce, 2, timeout=120)
    print(f"cold first call, N=2 (forkserver start with torch preloaded + a fresh world): "
          f"{time.perf_counter() - start:.2f} s", flush=True)

    results = {}
    for n in (2, 4):
        call, in_rank, overhead = harness_overhead(run, n, args.calls)
        results[n] = (call, overhead)
        print(f"harness N={n}: median call {call * 1e3:.2f} ms, in-rank {in_rank * 1e3:.2f} ms, "
              f"overhead {overhead * 1e3:.2f} ms  ({args.calls} calls)", flush=True)
    shutdown()   # the spawn baseline gets the machine to itself

    spawn = {}
    for n in map(int, args.spawn_sizes.split(",")):
        times = [spawn_call(n) for _ in range(args.spawn_calls)]
        spawn[n] = statistics.median(times)
        print(f"spawn per call N={n}: {', '.join(f'{t:.2f}' for t in times)} s  "
              f"(median {spawn[n]:.2f} s, {spawn[n] / results[n][0]:.0f}x the harness call)", flush=True)

    print(f"overhead_ms_n2={results[2][1] * 1e3:.2f} overhead_ms_n4={results[4][1] * 1e3:.2f} "
          f"speedup_vs_spawn_n4={spawn[4] / results[4][0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
