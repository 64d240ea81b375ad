"""What each torchrun rank runs: ``python -m kit.launch.worker N FILE --steps S --backend B`` (kit.launch execs it).

The process group comes from the variables torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, ...).  Each
rank loads your file, runs every contender of the workload in turn (yours and torch's, the same
steps on the same data), and sends its figures to every rank; rank 0 prints the table.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import harness
from harness import Target

from .. import catalogue
from . import measure, mlp, workload_for

EXIT_NOT_IMPLEMENTED = 3
TIMEOUT = timedelta(minutes=5)   # a collective that never completes (a hang) fails after this, not torch's 30 minutes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kit.launch.worker")
    p.add_argument("problem", type=int)
    p.add_argument("file")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    args = p.parse_args(argv)
    # torch 2.13 renamed these two (``*_single``) and warns on the old names, which every supported torch has
    warnings.filterwarnings("ignore", message=".*(all_gather_into_tensor|reduce_scatter_tensor).*",
                            category=FutureWarning)
    problem = catalogue.load()[args.problem]
    module_name, function = workload_for(problem)
    device = _join(args.backend)
    mine = Target(args.file, problem.names, problem.stand_ins).load()
    workload = importlib.import_module(f"{__package__}.{module_name}")
    comparisons = getattr(workload, function)(mine, device)
    measure.resident_memory_follows_tensors()
    with harness.recording():   # (the tracer's first use installs it: not inside the first contender)
        getattr(workload, "warm_up", mlp.warm_up)(device)
    figures = {}
    try:
        for comparison in comparisons:
            for contender in comparison.yours + [comparison.torch]:
                figures[contender.label] = measure.run(contender, args.steps, device)
    except NotImplementedError as e:   # the stub, or a part not written yet: every rank raises it
        if dist.get_rank() == 0:
            print(f"kit.launch: {args.file} is not finished ({e}); `python judge.py {problem.number}` "
                  "says what is left", file=sys.stderr)
        return EXIT_NOT_IMPLEMENTED
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, figures)
    if dist.get_rank() == 0:
        print(_header(problem, args, device, getattr(workload, "describe", mlp.describe)()))
        print(measure.table(comparisons, everyone))
    dist.destroy_process_group()
    return 0


def _join(backend: str) -> torch.device:
    """Join torchrun's world; this rank's device (under NCCL, the node's GPU LOCAL_RANK)."""
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend, timeout=TIMEOUT)
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def _header(problem, args, device, workload: str) -> str:
    nodes = dist.get_world_size() // int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    return (f"kit.launch: problem {problem.number} ({problem.title}), {os.path.relpath(args.file)}\n"
            f"{dist.get_world_size()} ranks on {nodes} node(s), {args.backend} on {device.type}; {workload}\n"
            f"per step: the median of {args.steps} after {measure.WARMUP} warm-up steps, the largest over ranks\n")


if __name__ == "__main__":
    sys.exit(main())
