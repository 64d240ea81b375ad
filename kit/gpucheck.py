"""The GPU check: every problem's reference on NCCL, one GPU per rank, for each world size this machine can start.

    python -m kit.gpucheck [--profile quick|default] [--problems N ...]

Prints one table, problem × world size: pass or fail, and the time, for the sizes that fit the GPUs;
"not run" with the reason for the others.  With a GPU per rank of every world the problems start,
it also runs the bench and selfcheck (quick profile) on NCCL.  Paste the table into an issue or the
README's GPU section, with the machine it ran on.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from . import catalogue
from .config import ROOT, KitConfig
from .judging import InternalError, judge_once
from .selfcheck import selfcheck_problem


def _cell(problem, gpus: int, size: int, profile: str) -> str:
    if size > gpus:
        return f"not run: needs {size} GPU{'' if size == 1 else 's'}"
    start = time.perf_counter()
    try:
        verdict = judge_once(problem, problem.solution_file(), KitConfig(profile=profile, backend="nccl",
                                                                          world_size=size))
    except InternalError as e:
        return f"error: {str(e).splitlines()[0]}"
    took = time.perf_counter() - start
    ran = [t for t in verdict.tests if t.outcome != "skipped"]
    failed = [t for t in ran if not t.passed]
    if not ran:
        return f"no test starts {size} ranks"
    if failed:
        return f"FAIL {failed[0].name} ({failed[0].kind}) {took:.1f}s"
    return f"pass {len(ran)} tests {took:.1f}s"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.gpucheck", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="quick", choices=["quick", "default", "thorough"])
    parser.add_argument("--problems", nargs="*", type=int, help="only these problems (default: all)")
    args = parser.parse_args(argv)
    from harness import gpu_count
    import torch
    problems = catalogue.load()
    chosen = [problems[n] for n in (args.problems or sorted(problems))]
    gpus = gpu_count()
    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, {gpus} GPU{'' if gpus == 1 else 's'}"
          + (f": {', '.join(names)}" if names else ""))
    largest = max(p.max_world_size for p in chosen)
    if gpus == 0:
        print("No GPU here, so NCCL cannot run: nothing was run. The problems run on gloo (CPU): python judge.py N")
    sizes = list(range(1, largest + 1))
    rows = [(p, [_cell(p, gpus, k, args.profile) for k in sizes]) for p in chosen]
    width = max(len(c) for _, cells in rows for c in cells)
    print("\n" + "problem".ljust(24) + "".join(f"{k} rank{'s' if k > 1 else ''}".ljust(width + 2) for k in sizes))
    for p, cells in rows:
        print(f"{p.number} {p.slug}"[:23].ljust(24) + "".join(c.ljust(width + 2) for c in cells))
    if gpus and gpus < largest:
        print(f"\nNot run: worlds of {gpus + 1} to {largest} ranks (this machine has {gpus} GPU"
              f"{'' if gpus == 1 else 's'}), the bench on NCCL, and selfcheck on NCCL.")
    bad = []
    if gpus >= largest:
        print("\npython -m harness.bench (NCCL where a world has a GPU per rank):", flush=True)
        subprocess.run([sys.executable, "-m", "harness.bench"], cwd=ROOT, env=dict(os.environ))
        config = KitConfig(profile="quick", backend="nccl")
        checks = [r for p in chosen for r in selfcheck_problem(p, config)]
        bad = [r for r in checks if not r["ok"]]
        print(f"\nselfcheck on NCCL (quick): {len(checks) - len(bad)} of {len(checks)} checks as expected")
        for r in bad:
            print(f"  SURPRISE {r['problem']} {r['target']}: {r['detail']}")
    failed = any(c.startswith(("FAIL", "error")) for _, cells in rows for c in cells)
    return 1 if failed or (gpus >= largest and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
