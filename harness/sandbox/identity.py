"""Each rank its own unprivileged uid, where the judge runs as root (a grading container, CI, Gradescope).

A rank that escapes everything else still runs as a uid that owns nothing: it cannot write the judge's
files, signal, trace or read the /proc entries of the test process, the forkserver or another rank,
and every socket it opens carries its uid (the traffic witness reads sockets by uid).  As in the IOI
judge's ``isolate``, the uids are not in /etc/passwd; they are picked from a range no account uses:
``BASE + (test process pid << 7) + rank``, and the world's group, which may use its store file and
its shared folder, is ``... + 64``.

The test process prepares the world's folders for these ids (``prepare_*``); each rank takes its id
(``become``) before any learner code runs, then keeps itself dumpable so the test process can read
its /proc entry.

Where Python itself lives in a folder other users may not read (a pyenv under /root, as on the
machines this kit is built on), a rank keeps one capability, CAP_DAC_READ_SEARCH: it may read files
it could not otherwise, and nothing more -- it still cannot write them, nor signal, trace or read the
memory of another process (those follow the uid), and Landlock, where present, still hides what it
hides.  ``open_by_handle_at``, the one escape that capability allows, is refused by the seccomp filter.
"""
from __future__ import annotations

import ctypes
import os
import struct
import sys
from dataclasses import dataclass

BASE = 0x40000000
_GROUP = 64     # the world's group id, after the (at most 64) ranks' uids
_PR_SET_DUMPABLE, _PR_SET_KEEPCAPS, _CAP_DAC_READ_SEARCH = 4, 8, 2


@dataclass(frozen=True)
class RankIds:
    uids: tuple      # rank r runs as uids[r]
    gid: int         # the group of every rank of the world
    read_anything: bool = False   # keep CAP_DAC_READ_SEARCH: Python's own files are not readable by others


def rank_ids(world_size: int, folder: str) -> tuple[RankIds | None, str]:
    """(the ids the ranks of a world get, why) -- (None, why not) when the judge is not root, or when
    ``folder`` (where the world's files live) is not reachable by another uid."""
    if os.geteuid() != 0:
        return None, "the judge is not root: the ranks run as its uid"
    blocked = _untraversable(folder)
    if blocked:
        return None, f"{blocked} is not searchable by other users (it needs o+x), so the ranks stay root"
    base = BASE + ((os.getpid() & 0x3FFFFF) << 7)
    locked = [p for p in dict.fromkeys([sys.prefix, sys.base_prefix, *sys.path]) if p and os.path.isdir(p)
              and _untraversable(p)]
    return RankIds(tuple(base + r for r in range(world_size)), base + _GROUP, bool(locked)), f"uid {base}+rank"


def _untraversable(folder: str) -> str | None:
    path = os.path.realpath(folder)
    while True:
        if not os.stat(path).st_mode & 0o001:
            return path
        if path == "/":
            return None
        path = os.path.dirname(path)


def prepare_private(folder: str, uid: int, gid: int):
    """A rank's own folder: its uid alone may enter."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chown(folder, uid, gid)
    os.chmod(folder, 0o700)


def prepare_shared(path: str, gid: int, directory: bool):
    """A file or folder every rank of the world may read and write (the store's file, a shared folder):
    group-owned, group-writable, and new files in a folder inherit the group (set-gid)."""
    os.chown(path, -1, gid)
    os.chmod(path, 0o2770 if directory else 0o660)


def prepare_tree(path: str, gid: int):
    """Every folder under a shared folder, made (by the test process, say) since it was granted: the ranks'
    group may create and rename files in it.  Files are left as they are."""
    for folder, _, _ in os.walk(path):
        st = os.stat(folder)
        if st.st_gid != gid or st.st_mode & 0o2070 != 0o2070:
            os.chown(folder, -1, gid)
            os.chmod(folder, st.st_mode | 0o2070)


def become(uid: int, gid: int, read_anything: bool = False) -> str | None:
    """Take the rank's uid and gid for good (real, effective and saved), keeping CAP_DAC_READ_SEARCH alone
    when ``read_anything``; None on success, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        os.setgroups([gid])
        os.setresgid(gid, gid, gid)
        if read_anything:
            libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
        os.setresuid(uid, uid, uid)
    except OSError as e:
        return f"setresuid({uid}): {e.strerror}"
    if read_anything and not _only_capability(libc, _CAP_DAC_READ_SEARCH):
        return f"capset: {os.strerror(ctypes.get_errno())}"
    os.umask(0o007)   # what one rank writes in the shared folder, the others may read and replace
    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)   # a uid change cleared it
    return None


def _only_capability(libc, cap: int) -> bool:
    """Effective and permitted sets: ``cap`` alone; inheritable: none (so nothing survives an exec)."""
    header = struct.pack("=Ii", 0x20080522, 0)   # _LINUX_CAPABILITY_VERSION_3, this process
    bit = 1 << cap
    data = struct.pack("=IIIIII", bit, bit, 0, 0, 0, 0)   # (effective, permitted, inheritable) x 2 words
    return libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(data)) == 0
