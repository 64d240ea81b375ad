#!/usr/bin/env python
"""Judge your distributed-training practice problems.

    python judge.py                      list problems, your progress, and what to do next
    python judge.py 113                  judge practice/113_*/ (your file)
    python judge.py 113 --solution       judge the reference
    python judge.py 113 --target F.py    judge any file (a student's, a known-wrong version)
    python judge.py 113 --tests DIR      use another test set laid out like practice/ (hidden tests)
    python judge.py 113 --add-tests DIR  the public tests and another test set, together
    python judge.py 113 --hint           show the next hint
    python judge.py 113 --watch          re-judge on every save: the score and the first failure
    python judge.py 113 --reset          restore the stub (your file is backed up)
    python judge.py 113 --trace t.json   write a timeline (Perfetto / chrome://tracing): the failing case's, if any
    python judge.py 113 --show           draw that timeline in the terminal
    python judge.py 113 --verbose        also show hypothesis's own output under each failure
    python judge.py 113 --backend nccl   run the ranks on NCCL, one GPU each (gloo on the CPU by default)
    python judge.py selfcheck [N ...]    reference passes, stub scores 0, every known-wrong version fails
    python judge.py grade 113 DIR --out grades.csv     grade a folder of submissions (a status per student)
    python judge.py grade 113 DIR --out g.csv --ray auto   the same, each submission a task on a Ray cluster
    python judge.py doctor               what this machine has and which problems run here, with fixes

Exit codes: 0 all passed, 1 some failed, 2 interrupted, 3 internal error, 4 usage error.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kit import cli  # noqa: E402  (the kit's own folder first, even from another directory)


def main(argv=None) -> int:
    return cli.main(__doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
