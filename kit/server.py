"""A warm test process for --watch: torch, the tests and the rank forkserver stay loaded between re-judges.

    python -m kit.server '<JSON list of kit options>'   (started by ``WarmTests``: its events pipe and lifeline)

Each line on stdin is one re-judge: a JSON list of pytest arguments, run as a fresh pytest session in
this process, whose plugin writes its report down the events pipe as usual (that is how the judge
knows the run is over).  What a cold run pays every time (starting Python, importing torch and the
tests, starting the forkserver with torch preloaded) is paid once.

Nothing stale crosses re-judges: every session ends with ``harness.shutdown()``, which stops its
worlds and forgets its kept results, so the next one starts fresh ranks (about 0.1 s a world from the
warm forkserver), and the learner's file is only ever loaded inside those ranks.
"""
from __future__ import annotations

import json
import sys

import pytest


def serve(kit_options: list, requests=sys.stdin):
    for line in requests:
        try:
            args = json.loads(line)
        except ValueError:
            continue
        pytest.main(args + kit_options)
        sys.stdout.flush()


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
