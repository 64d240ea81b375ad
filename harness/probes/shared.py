"""``SharedFolder``: a folder every rank of the call may read and write (the sandbox otherwise gives a rank
only its private folder).  Files there outlive the call and the world, so one call can save and a later
one, on another world size, load (checkpoints, problem 125).

    folder = harness.SharedFolder()             # a fresh folder the harness makes (and removes at exit)
    harness.run(save, 2, ..., probes=[folder])
    os.listdir(folder.path)

It is a channel between the ranks of a call: a call that grants it should not be judged on what the
ranks send each other.  Worlds are built for their folder (it is granted when the ranks start); there
is one shared-folder world per size.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from .base import Probe


class SharedFolder(Probe):
    name = "shared"

    def __init__(self, path: str | None = None):
        """``path``: an existing folder (the ranks must be able to reach it); by default a new one."""
        if path is None:
            path = tempfile.mkdtemp(prefix="harness-shared-")
            os.chmod(path, 0o711)
            atexit.register(shutil.rmtree, path, True)
        if not os.path.isdir(path):
            raise ValueError(f"SharedFolder needs an existing folder (the sandbox grants it when the ranks "
                             f"start), got {path!r}")
        self.path = os.path.realpath(path)

    def world_key(self):
        return self.path

    def start(self, world):
        """Folders the test process made in it since the last call become the ranks' too (their own uid)."""
        world.grant_shared()

    def __repr__(self):
        return f"SharedFolder({self.path!r})"
