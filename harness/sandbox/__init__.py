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

Where the kernel or a seccomp policy lacks Landlock, ``confine`` applies no Landlock rules and returns
the reason (``STATUS`` says it too), and the file witness (``probes.files``, mode "enforce") applies the
same read and write rules from the test process, below Python; where seccomp is missing too, the ranks
run unconfined and every report says so (``protections``): the kit runs everywhere.

This module decides what a rank may reach and applies it; the Landlock rules and syscalls are in
``_landlock``, the filter in ``_seccomp``.
"""
from __future__ import annotations

import glob
import os
import tempfile

from .landlock import (READ, SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL, SHARED_MEMORY, Unavailable, landlock_abi,
                        read_rules, restrict_self, unavailable_reason, write_rules)
from .identity import become
from .seccomp import restrict

__all__ = ["confine", "guard_store", "hint", "landlock_abi", "unavailable_reason", "STATUS", "STORE_GUARDED"]

_PINNED: list[int] = []   # O_PATH fds that keep the /proc/<own pid> rule's dentry (and so its inode) alive
# What confine() did in this process, in a line: None (never called), "confined: ..." (Landlock applied) or
# the reason Landlock is not ("unavailable: ...", "off: ..."), with the seccomp and uid states after it.
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
            gpu: bool = False, landlock: bool = True, ids: tuple | None = None, ids_note: str = "") -> dict:
    """Confine this process (see the module docstring); returns what is in force, as plain data::

        {"landlock": "ABI 7" | "unavailable: <why>" | "off: <why>",
         "seccomp": "on" | "unavailable: <why>",
         "uid": "rank uid 1073741953" | "unavailable: <why>" | "not needed: <why>"}

    private_dir   this rank's own folder: its TMPDIR, the only folder it may write in
    store_file    the FileStore's file (it is reopened for every store operation)
    hidden        folders and files to deny even reading (the kit's answers and tests; other ranks'
                  folders and every ``harness-*`` folder beside ``private_dir``'s parent are added)
    writable      further files or folders it may write (a shared folder)
    readable      folders under ``hidden`` that it may read anyway
    gpu           NCCL needs /dev/nvidia* and /dev/shm, and Unix sockets between ranks
    landlock      False: leave Landlock out, as a kernel without it would (tests of the fallback)
    ids           (uid, gid, read_anything) to run as from now on (``identity.become``), or None to stay
    ids_note      why there are no ids (shown in the state)

    In every case, points TMPDIR (and ``tempfile.tempdir``), TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR,
    TORCH_EXTENSIONS_DIR and XDG_CACHE_HOME into ``private_dir``, so tempfile and torch.compile work.
    The uid and the seccomp filter apply whatever Landlock does: no path skips them.
    Call it while the process is single-threaded: Landlock leaves threads that already exist alone.
    """
    global STATUS
    private_dir = os.path.realpath(private_dir)
    os.makedirs(private_dir, mode=0o700, exist_ok=True)
    _point_scratch_at(private_dir)
    state = {"uid": "unavailable" if ids is not None else f"unavailable: {ids_note}" if os.geteuid() == 0
             else f"not needed: {ids_note or 'the judge is not root'}"}
    if ids is not None:
        why = become(*ids)
        state["uid"] = f"rank uid {ids[0]}" if why is None else f"unavailable: {why}"
    state["landlock"] = _landlock(private_dir, store_file, hidden, writable, readable, gpu) if landlock else \
        "off: left out on purpose (as on a kernel without Landlock)"
    why = restrict(unix_sockets=gpu)
    state["seccomp"] = "on" if why is None else f"unavailable: {why}"
    STATUS = (f"confined: {state['landlock']}" if state["landlock"].startswith("ABI") else
              state["landlock"]) + f"; seccomp {state['seccomp']}; uid {state['uid']}"
    return state


def _landlock(private_dir, store_file, hidden, writable, readable, gpu) -> str:
    """Apply the Landlock rules; returns "ABI <n>[, notes]" or "unavailable: <why>"."""
    abi = landlock_abi()
    if isinstance(abi, str):
        return f"unavailable: {abi}"
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
        _PINNED.extend(restrict_self(abi, rules, scoped))
    except Unavailable as e:
        return f"unavailable: {e}"
    notes = [f"ABI {abi}"]
    if abi < 6:
        notes.append("abstract sockets and signals not scoped (needs ABI 6)")
    if threads > 1:
        notes.append(f"{threads - 1} thread(s) started earlier are not confined")
    return ", ".join(notes)


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
