"""Pick a problem's implementation from a small script's command line (``--solution`` / ``--target FILE``).

For the helper scripts beside a problem (e.g. ``practice/115_zero_optimizer/measure.py``)
that run the learner's code on ranks outside pytest.
"""
from __future__ import annotations

import argparse

from harness import Target

from . import catalogue


def target_from_command_line(number: int, description: str, argv=None) -> Target:
    """The learner's file by default, the reference with ``--solution``, or ``--target FILE``; validated."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--solution", action="store_true", help="use the reference instead")
    parser.add_argument("--target", help="use this file")
    args = parser.parse_args(argv)
    problem = catalogue.load()[number]
    path = args.target or (problem.solution_file() if args.solution else problem.practice_file())
    return Target(path, problem.names).validate()
