"""The supervisor carrying out a rank's file call as that rank: its uid, gid and groups, and its capabilities.

In mode "enforce" the supervisor opens, creates and renames on a rank's behalf.  Where the judge runs as
root and each rank as its own uid, doing so as root would let a rank read what root may read and make
root-owned files.  So, for the length of one call, the supervisor's own thread takes the caller's
filesystem identity: fsuid and fsgid, the supplementary groups, and the one capability a rank may keep
(CAP_DAC_READ_SEARCH, ``identity``).  These are per-thread on Linux (raw system calls: the C library's
wrappers would change every thread), and the thread takes its own back afterwards.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import struct

from .landlock import libc, machine

_SYS = {"x86_64": {"setfsuid": 122, "setfsgid": 123, "setgroups": 116, "capget": 125, "capset": 126},
        "aarch64": {"setfsuid": 151, "setfsgid": 152, "setgroups": 159, "capget": 90, "capset": 91}}
_VERSION_3, _CAP_DAC_READ_SEARCH = 0x20080522, 2


def _call(name: str, *args) -> int:
    return libc().syscall(ctypes.c_long(_SYS[machine()][name]), *args)


def _status(tid: int) -> dict:
    with open(f"/proc/{tid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _capabilities() -> bytes:
    header, data = struct.pack("=Ii", _VERSION_3, 0), ctypes.create_string_buffer(24)
    _call("capget", ctypes.c_char_p(header), data)
    return data.raw


def _set_capabilities(data: bytes):
    _call("capset", ctypes.c_char_p(struct.pack("=Ii", _VERSION_3, 0)), ctypes.c_char_p(data))


def _set_groups(groups: list):
    array = (ctypes.c_uint * max(1, len(groups)))(*groups)
    _call("setgroups", ctypes.c_size_t(len(groups)), array)


@contextlib.contextmanager
def acting_as(tid: int):
    """This thread, for the block, with thread ``tid``'s filesystem identity (nothing changes when we share it)."""
    status = _status(tid)
    fsuid, fsgid = int(status["Uid"].split()[3]), int(status["Gid"].split()[3])
    if os.geteuid() != 0 or (fsuid, fsgid) == (os.getuid(), os.getgid()):
        yield
        return
    groups = [int(g) for g in status.get("Groups", "").split()]
    keeps_reads = int(status["CapEff"], 16) >> _CAP_DAC_READ_SEARCH & 1
    saved_caps, saved_groups = _capabilities(), os.getgroups()
    _set_groups(groups)
    _call("setfsgid", ctypes.c_uint(fsgid))
    _call("setfsuid", ctypes.c_uint(fsuid))
    # effective: the caller's one capability, or none; permitted and inheritable (both words) as they were
    low, high = struct.unpack_from("=III", saved_caps), struct.unpack_from("=III", saved_caps, 12)
    effective = 1 << _CAP_DAC_READ_SEARCH if keeps_reads else 0
    _set_capabilities(struct.pack("=III", effective, *low[1:]) + struct.pack("=III", 0, *high[1:]))
    try:
        yield
    finally:   # capabilities first: setting the ids and groups back needs CAP_SETUID and CAP_SETGID
        _set_capabilities(saved_caps)
        _call("setfsuid", ctypes.c_uint(os.getuid()))
        _call("setfsgid", ctypes.c_uint(os.getgid()))
        _set_groups(saved_groups)
