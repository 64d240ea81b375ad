"""Close the cheap side channels between ranks: files, shared memory, other ranks' /proc, signals.

Every property of a graded run looks at what the ranks send each other through
``torch.distributed``.  Without this module a submission could move the real data
through ``/dev/shm`` or a file in ``/tmp`` and keep the trace happy with right-sized
decoy sends.  ``confine`` is called once in each rank, before any learner code runs
and before ``init_process_group``: Landlock confines the calling thread and the
threads it creates later, and gloo's worker threads (which run ``Future.then``
callbacks) are created by ``init_process_group``.  It uses:

* **Landlock** (Linux >= 5.13, unprivileged, binds root too).  A rank may write only in
  its private folder (its TMPDIR), the rendezvous store's file and ``/dev/null``.  It may
  read everything else except other ranks' folders (the world folder and every
  ``harness-*`` folder beside it), ``/dev/shm``, device files other than null, zero, full,
  random and urandom, and other processes' ``/proc/<pid>``.  Reads stay broad on purpose:
  when no rank can write where another reads, reading moves nothing between ranks, and
  the learner's file, the kit and Python may live anywhere.  (Landlock only grants, so
  "all but X" is granted per sibling; an entry created later beside X, such as a new
  folder in /tmp, is unreadable.)  On ABI >= 6 a rank also may not connect to abstract
  Unix sockets or signal processes outside its own sandbox.
* **seccomp** (a small filter): System V shared memory, semaphores and message queues,
  POSIX message queues, the kernel keyrings and sethostname fail with EPERM; they
  bypass the filesystem, so Landlock does not see them.

Open, by necessity: TCP/UDP sockets (gloo connects to peers on ports chosen at run
time; Landlock cannot restrict UDP, and a TCP rule per port cannot tell gloo's
ephemeral ports from a submission's), the rendezvous store (``FileStore`` reopens
its file for every operation, and ``new_group`` rendezvouses through it;
``guard_store`` refuses the Python-level calls), and timing.  Files already open
keep working, which also means an inherited writable fd shared by the ranks (stdout)
is a channel: ``rank_main`` gives each rank its own.

Where the kernel or a seccomp policy lacks Landlock, ``confine`` does nothing but
return the reason (``STATUS`` says it too): the kit runs everywhere.

This module decides what a rank may reach and applies it; the Landlock rules and syscalls are in
``_landlock``, the filter in ``_seccomp``.
"""
from __future__ import annotations

import glob
import os
import tempfile

from .landlock import (READ, SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL, SHARED_MEMORY, Unavailable, landlock_abi,
                        read_rules, restrict_self, unavailable_reason, write_rules)
from .seccomp import deny_ipc

__all__ = ["confine", "guard_store", "hint", "landlock_abi", "unavailable_reason", "STATUS", "STORE_GUARDED"]

_PINNED: list[int] = []   # O_PATH fds that keep the /proc/<own pid> rule's dentry (and so its inode) alive
# What confine() did in this process: None (never called), "confined: ..." or "unavailable: ...".
STATUS: str | None = None


def _point_scratch_at(private_dir: str):
    """tempfile and the caches that torch and other libraries write, into the private folder.

    The forkserver (or the test process) may already have set TORCHINDUCTOR_CACHE_DIR to
    /tmp/torchinductor_<user>: torch._inductor sets it on first use.
    """
    os.environ["TMPDIR"] = private_dir
    tempfile.tempdir = private_dir
    for name, sub in _CACHES.items():
        os.environ[name] = os.path.join(private_dir, sub)


_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "torchinductor", "TRITON_CACHE_DIR": "triton",
           "TORCH_EXTENSIONS_DIR": "torch_extensions", "XDG_CACHE_HOME": "cache"}


# ---- the entry point -----------------------------------------------------------------------------

def confine(private_dir: str, *, store_file: str | None = None, hidden=(), writable=(), readable=(),
            gpu: bool = False, seccomp: bool = True) -> str | None:
    """Confine this process (see the module docstring).  Returns None when confined, else the reason.

    private_dir   this rank's own folder: its TMPDIR, the only folder it may write in
    store_file    the FileStore's file (it is reopened for every store operation)
    hidden        folders to deny even reading (other ranks' folders; every ``harness-*`` folder
                  beside ``private_dir``'s parent is added, so other worlds are hidden too)
    writable      further files or folders it may write (rare)
    readable      folders under ``hidden`` that it may read anyway
    gpu           NCCL needs /dev/nvidia* and /dev/shm, and abstract Unix sockets between ranks

    In every case, points TMPDIR (and ``tempfile.tempdir``), TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR,
    TORCH_EXTENSIONS_DIR and XDG_CACHE_HOME into ``private_dir``, so tempfile and torch.compile work.
    Call it while the process is single-threaded: threads that already exist are not confined.
    """
    global STATUS
    private_dir = os.path.realpath(private_dir)
    os.makedirs(private_dir, mode=0o700, exist_ok=True)
    _point_scratch_at(private_dir)
    abi = landlock_abi()
    if isinstance(abi, str):
        STATUS = f"unavailable: {abi}"
        return abi
    world_dir = os.path.dirname(private_dir)
    hide = {os.path.realpath(h) for h in hidden}
    hide |= {os.path.realpath(p) for p in glob.glob(os.path.join(os.path.dirname(world_dir), "harness-*"))}
    hide.add(world_dir)
    if not gpu:
        hide |= {os.path.realpath(p) for p in SHARED_MEMORY if os.path.exists(p)}
    # a folder above the private one would also grant it to other ranks: refuse rather than leak
    hide = {h for h in hide if h != "/"}
    threads = len(os.listdir("/proc/self/task"))
    rules = read_rules(sorted(hide), gpu)
    rules += [(os.path.realpath(r), READ) for r in readable]
    rules += write_rules(private_dir, [os.path.realpath(w) for w in writable] +
                          ([os.path.realpath(store_file)] if store_file else []))
    scoped = 0 if gpu else SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    try:
        pinned = restrict_self(abi, rules, scoped)
    except Unavailable as e:
        STATUS = f"unavailable: {e}"
        return str(e)
    _PINNED.extend(pinned)
    done = [f"Landlock ABI {abi}"]
    if abi < 6:
        done.append("abstract sockets and signals not scoped (needs ABI 6)")
    if seccomp:
        why = deny_ipc()
        done.append("seccomp IPC filter" if why is None else f"no seccomp IPC filter ({why})")
    if threads > 1:
        done.append(f"{threads - 1} thread(s) started earlier are not confined")
    STATUS = "confined: " + ", ".join(done)
    return None


# ---- the rendezvous store ------------------------------------------------------------------------

STORE_GUARDED = False


def guard_store() -> None:
    """Refuse, with a PermissionError, every call on a c10d Store made from Python from now on.

    Call it after init_process_group.  torch 2.13 makes no Python-level store call after that for
    new_group, new_subgroups, DDP or the ``*_object`` collectives (their rendezvous runs in C++),
    unless TORCH_DIST_INIT_BARRIER=1.  It closes ``_get_default_store().set(...)``, the one-line route;
    a determined submission can still reach the original methods (they stay referenced) or write
    records into the store's file, as it can open its own TCP sockets: a speed bump, not a wall.
    """
    global STORE_GUARDED
    import torch.distributed as dist

    def refuse(cls_name, name):
        def refused(self, *args, **kwargs):
            raise PermissionError(f"{cls_name}.{name}: the rendezvous store belongs to the harness; ranks exchange "
                                  "data through torch.distributed ops only")
        refused.__name__ = name
        return refused

    pending, seen = [dist.Store], set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        for name, attr in list(vars(cls).items()):
            if name.startswith("_") or isinstance(attr, (property, staticmethod, classmethod)) or not callable(attr):
                continue
            setattr(cls, name, refuse(cls.__name__, name))
    STORE_GUARDED = True


def hint(exc: BaseException) -> str:
    """A line to add to a PermissionError that the sandbox caused ('' otherwise)."""
    if (not (STATUS or "").startswith("confined") or not isinstance(exc, PermissionError)
            or "harness" in str(exc)):
        return ""
    return (f" (the harness confines each rank: it may write only in its own temporary folder, "
            f"{tempfile.gettempdir()}, and may not read other ranks' files, /dev/shm or other processes' /proc; "
            "ranks exchange data through torch.distributed ops only)")
