"""--watch: judge a stable copy of the learner's file after every save, and give up on a judge that a newer
save makes stale."""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time


def _stamp(path: str):
    try:
        st = os.stat(path)
        return st.st_mtime_ns, st.st_size
    except OSError:
        return None


def _stable(path: str, settle: float):
    """(stamp, bytes) of the file once it has stopped changing for ``settle`` seconds, else None.

    An editor's save truncates the file before it writes it: a judge of that moment would score a file
    nobody wrote, and a judge that reads the file while it changes would score a mix of two saves.
    """
    before = _stamp(path)
    if before is None:
        return None
    time.sleep(settle)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if _stamp(path) != before:
        return None
    return before, data


def watch(path: str, judge, poll: float = 0.2, max_runs: int | None = None, settle: float = 0.1,
          superseded=None):
    """Call ``judge(copy, stop)`` now and after every save of ``path``, in a thread of its own.

    ``copy`` is a file with the same name, in a folder of its own, holding the save exactly: the judge never
    sees a later edit.  ``stop`` (a threading.Event) is set when a newer save, with other content, arrives
    while the judge runs: ``judge`` should return soon, ``superseded()`` is called, and the newer save is
    judged next.  Ctrl-C sets ``stop`` too, waits for the judge to return, and is raised.
    """
    folder = tempfile.mkdtemp(prefix="kit-watch-")
    try:
        last, runs = None, 0
        while max_runs is None or runs < max_runs:
            if _stamp(path) == last:
                time.sleep(poll)
                continue
            saved = _stable(path, settle)
            if saved is None:
                continue   # still being written (or gone): look again
            last, data = saved
            copy = os.path.join(folder, str(runs), os.path.basename(path))
            os.makedirs(os.path.dirname(copy))
            with open(copy, "wb") as f:
                f.write(data)
            runs += 1
            stop = threading.Event()
            worker = threading.Thread(target=judge, args=(copy, stop), daemon=True)
            worker.start()
            try:
                last = _wait_unless_saved(path, worker, last, data, stop, poll, settle)
            except BaseException:
                stop.set()
                worker.join(30)
                raise
            if stop.is_set() and superseded:
                superseded()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _wait_unless_saved(path, worker, stamp, data, stop, poll, settle):
    """Wait for ``worker``; a save with new content sets ``stop`` and waits for it to return.  Returns the
    stamp of the save judged last (the newer one is then looked at again by the caller)."""
    while worker.is_alive():
        worker.join(poll)
        now = _stamp(path)
        if now == stamp or not worker.is_alive():
            continue
        saved = _stable(path, settle)
        if saved is None:
            continue
        if saved[1] == data:   # saved again as it was (a touch): this judge is still the right one
            stamp = saved[0]
            continue
        stop.set()
        worker.join()
        return stamp
    return stamp
