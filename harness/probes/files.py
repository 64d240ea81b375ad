"""The file witness: every file call of a world's ranks, seen below Python by the test process.

Each rank routes its file system calls to the test process through a seccomp user-notification filter
(``sandbox.notify``); this module runs their supervisors, in a thread of their own that answers as the
calls come (a routed call waits in the kernel until it is answered).  What it does depends on what
else confines the rank:

* with Landlock (mode "events"), Landlock enforces what a rank may read and write; the witness counts
  the write events under a shared folder and carries out ``KillAt`` from outside the rank.  Worlds
  without a shared folder need neither, and run no filter.
* without it (mode "enforce"), the witness is the filesystem sandbox: it refuses reads of hidden paths
  (the kit's answers and tests, other ranks' folders, /dev/shm) and writes outside the rank's own
  folder, the store's file and the shared folder, and carries each allowed call out itself, as the
  rank (``sandbox._acting``), so no thread can swap the path after the check.
"""
from __future__ import annotations

import glob
import os
import threading

from ..sandbox.notify import Rules, Supervisor, recv_fd
from ..sandbox.landlock import SHARED_MEMORY
from ..world.waiting import readable
from .kill import Killed

_TICK = 0.2   # seconds the supervising thread waits before it looks at which supervisors are open


class FileWitness:
    """The supervisors of one world's ranks, and the thread that answers them."""

    def __init__(self, world_dir: str, setups: list):
        self.world_dir, self.setups = world_dir, setups
        self.lock = threading.Lock()
        self.base: dict = {}                      # rank -> its rules between kills
        self.supervisors: dict[int, Supervisor] = {}
        self.states: dict[int, str] = {}          # rank -> what the witness does for it (protections)
        self.closed = False
        self.thread = threading.Thread(target=self._serve, name="harness-files", daemon=True)

    def adopt(self, rank: int, conn_fd: int):
        """Take rank ``rank``'s first message: its listener fd and mode, or why it has none."""
        fd, text = recv_fd(conn_fd)
        if fd is None:
            self.states[rank] = f"unavailable: {text}"
            return
        self.states[rank] = "enforced below Python" if text == "enforce" else "landlock, counted below Python"
        with self.lock:
            self.base[rank] = _rules(self.world_dir, self.setups, rank, text)
            self.supervisors[rank] = Supervisor(fd, self.base[rank])
        if not self.thread.is_alive():   # not started yet, or it ended while no supervisor was live
            self.thread = threading.Thread(target=self._serve, name="harness-files", daemon=True)
            self.thread.start()

    def reset(self):
        """A new call: each rank's base rules again, nothing counted, nothing armed."""
        with self.lock:
            for rank, supervisor in self.supervisors.items():
                supervisor.reset(self.base[rank])

    def can_kill(self, rank: int) -> bool:
        return rank in self.supervisors

    def arm_kill(self, rank: int, event: int, under: str):
        """Kill rank ``rank`` just before its ``event``-th write event under ``under``."""
        with self.lock:
            base = self.base[rank]
            self.supervisors[rank].reset(Rules(base.mode, base.hidden, base.writable, under, (event, None)))

    def kept_sockets(self, rank: int) -> dict:
        """inode -> a path of our copy, for each socket rank ``rank``'s processes connected (``notify``)."""
        with self.lock:
            supervisor = self.supervisors.get(rank)
            fds = list(supervisor.sockets) if supervisor is not None else []
        return {os.fstat(fd).st_ino: f"/proc/self/fd/{fd}" for fd in fds}

    def release_sockets(self, still_held):
        """Close our copies of the sockets no process of their rank holds any more (``still_held(rank)``: the
        inodes it holds, asked only of a rank we keep copies for): the traffic witness has read them, and
        their connections may close now."""
        with self.lock:
            for rank, supervisor in self.supervisors.items():
                if not supervisor.sockets:
                    continue
                keep, held = [], still_held(rank)
                for fd in supervisor.sockets:
                    if os.fstat(fd).st_ino in held:
                        keep.append(fd)
                    else:
                        os.close(fd)
                supervisor.sockets = keep

    def killed(self, rank: int) -> Killed | None:
        with self.lock:
            supervisor = self.supervisors.get(rank)
            event = supervisor.killed if supervisor is not None else None
            return None if event is None else Killed.at(rank, f"its file event {len(supervisor.events)}: "
                                                              f"{supervisor.describe(event)}")

    def close(self):
        with self.lock:
            self.closed = True
            for supervisor in self.supervisors.values():
                supervisor.close()

    def _serve(self):
        while not self.closed:
            with self.lock:
                live = [s for s in self.supervisors.values() if s.listener_fd >= 0 and not s.done]
            if not live:
                return
            ready = readable(live, _TICK)
            with self.lock:
                for supervisor in ready:
                    if supervisor.listener_fd >= 0:
                        supervisor.handle_ready()


def mode_for(landlock_applied: bool, shared: bool) -> str:
    """Which filter a rank installs: "enforce" without Landlock, else "events" (write events counted where a
    shared folder needs it; every connect seen, so that each TCP socket is kept till the traffic witness
    has read it)."""
    return "enforce" if not landlock_applied else "events"


def _rules(world_dir: str, setups: list, rank: int, mode: str) -> Rules:
    if mode == "events":
        return Rules("events")
    setup = setups[rank]
    shared = [setup.shared] if setup.shared else []
    hidden = [p for other in setups if other.rank != rank for p in (other.tmp, other.stderr, other.stack)]
    hidden += [setup.stderr, setup.stack]   # its own, already open: read and written through the open fds
    hidden += [p for p in glob.glob(os.path.join(os.path.dirname(world_dir), "harness-*"))
               if os.path.realpath(p) not in {os.path.realpath(world_dir), *map(os.path.realpath, shared)}]
    hidden += [p for p in SHARED_MEMORY if os.path.exists(p)] + list(setup.sandbox.hidden)
    return Rules("enforce", hidden=tuple(hidden),
                 writable=(setup.tmp, setup.store, *shared, "/dev/null", "/dev/full", "/dev/zero"))
