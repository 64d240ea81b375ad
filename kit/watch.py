"""--watch: call back after every save of the learner's file."""
from __future__ import annotations

import os
import time


def watch(path: str, on_change, poll: float = 0.5, max_runs: int | None = None):
    """Call ``on_change()`` now and after every save of ``path`` (mtime or size changes)."""
    def stamp():
        try:
            st = os.stat(path)
            return st.st_mtime_ns, st.st_size
        except OSError:
            return None
    last, runs = None, 0
    while max_runs is None or runs < max_runs:
        current = stamp()
        if current != last:
            last = current
            on_change()
            runs += 1
            continue
        time.sleep(poll)
