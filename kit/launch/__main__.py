"""The command line: ``python -m kit.launch N [--target FILE | --solution] [--steps S] [--backend B] [torchrun args]``.

Everything it does not know is torchrun's (``--nnodes 2 --nproc-per-node 4 --rdzv-endpoint host:29500``;
after ``--``, all of it).  Without any: SLURM's variables mapped (``slurm``), else ``DEFAULT_TORCHRUN``.
It checks the problem and the file here, then execs
``python -m torch.distributed.run <torchrun args> -m kit.launch.worker N FILE --steps S --backend B``.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from harness import Target, TargetError

from .. import catalogue
from . import problems_with_a_workload, slurm, workload_for

DEFAULT_TORCHRUN = ["--standalone", "--nproc-per-node", "2"]
EXIT_USAGE = 4   # judge.py's code for a usage error


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        _usage(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m kit.launch", allow_abbrev=False,
                description="Run your implementation of a problem under torchrun, beside torch's own, and print "
                            "per-step figures (a measurement, not a grade).",
                epilog="Any other argument is torchrun's (after --, all of them). Default: "
                       f"{' '.join(DEFAULT_TORCHRUN)}, or SLURM's variables when set.")
    p.add_argument("problem", type=int, help="the problem's number")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--target", metavar="FILE", help="your file (default: practice/<problem>/<its file>)")
    which.add_argument("--solution", action="store_true", help="run the reference instead")
    p.add_argument("--steps", type=int, default=10, help="measured steps, after 2 warm-up steps (default 10)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                   help="gloo: ranks compute on the CPU; nccl: one GPU per rank (default gloo)")
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command instead of running it")
    return p


def plan(argv=None, env=None) -> tuple:
    """(our arguments, the torchrun command) for ``argv``.  A usage error: SystemExit(EXIT_USAGE), said on stderr."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    ours, torchrun = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args, unknown = parser().parse_known_args(ours)
    torchrun = unknown + torchrun
    if args.steps < 1:
        _usage(f"--steps must be at least 1 (got {args.steps})")
    try:
        problems = catalogue.load()
    except catalogue.CatalogueError as e:
        _usage(f"problems.yaml: {e}")
    problem = problems.get(args.problem)
    with_one = ", ".join(map(str, problems_with_a_workload(problems)))
    if problem is None:
        _usage(f"there is no problem {args.problem}; kit.launch runs problems {with_one}")
    if workload_for(problem) is None:
        _usage(f"problem {problem.number} ({problem.title}) has no workload to run under torchrun; "
               f"kit.launch runs problems {with_one}")
    path = args.target or (problem.solution_file() if args.solution else problem.practice_file())
    try:
        Target(path, problem.names).validate()
    except TargetError as e:
        _usage(str(e))
    torchrun = torchrun or slurm.torchrun_args(env, slurm.hostnames_here()) or DEFAULT_TORCHRUN
    return args, [sys.executable, "-m", "torch.distributed.run", *torchrun, "-m", "kit.launch.worker",
                  str(problem.number), os.path.abspath(path), "--steps", str(args.steps), "--backend", args.backend]


def _usage(message: str):
    print(f"kit.launch: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def main(argv=None):
    args, cmd = plan(argv)
    if args.dry_run:
        print(shlex.join(cmd))
        return
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")   # what torchrun would set, without its banner saying so
    os.execve(sys.executable, cmd, env)


if __name__ == "__main__":
    main()
