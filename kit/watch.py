"""--watch: call back after every save of the learner's file."""
from __future__ import annotations

import os
import time


def watch(path: str, on_change, poll: float = 0.2, max_runs: int | None = None, settle: float = 0.1):
    """Call ``on_change()`` now and after every save of ``path`` (mtime or size changes).

    A save is taken once the file has stopped changing for ``settle`` seconds: an editor's save
    truncates the file before it writes it, and a judge of that empty moment would score a file
    nobody wrote.
    """
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
            time.sleep(settle)
            if stamp() != current:
                continue   # still being written: look again
            last = current
            on_change()
            runs += 1
            continue
        time.sleep(poll)
