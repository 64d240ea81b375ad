"""The rank side of ``notify``: the seccomp filter that hands file calls to a supervisor process.

``install(mode)`` loads a BPF program with SECCOMP_FILTER_FLAG_NEW_LISTENER and returns the listener
fd.  The program sends the file calls below to the listener (SECCOMP_RET_USER_NOTIF) and lets
everything else through, except the calls that reach files without a path the supervisor could
check, which fail with EPERM: io_uring (its requests open and rename files with no system call the
filter sees) and open_by_handle_at; and, as in the sandbox's IPC filter, the 32-bit and x32 entry
points.  The sandbox's own seccomp filter is assumed beside this one: it denies ptrace and
process_vm_readv (another process's memory), new namespaces and mounts (a path would mean something
else to the rank than to the supervisor) and prctl(PR_SET_DUMPABLE) (a process that is not dumpable
locks a supervisor of the same user out of its memory and /proc entries).

Mode "events" (Landlock enforces; the supervisor only counts) routes ``open``/``openat`` only when
their flags ask to write, so reads cost one BPF run; mode "enforce" routes every open and exec.  Both
route ``connect``, so that the supervisor holds a copy of every TCP socket a rank connects (the traffic
witness then reads its counters even after the rank closed its own).
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

from .landlock import libc, machine

MODES = ("events", "enforce")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PR_SET_NO_NEW_PRIVS = 38

# SECCOMP_FILTER_FLAG_NEW_LISTENER | TSYNC | TSYNC_ESRCH: every thread of the process, one listener;
# WAIT_KILLABLE_RECV: once the supervisor has read a call, only a fatal signal interrupts it, so a
# call the supervisor has carried out is not restarted (and carried out twice) after a signal.
_FLAGS = (1 << 3) | (1 << 0) | (1 << 4) | (1 << 5)
_SET_MODE_FILTER, _GET_ACTION_AVAIL, _GET_NOTIF_SIZES = 1, 2, 3
_RET_ALLOW, _RET_NOTIFY, _RET_ERRNO = 0x7FFF0000, 0x7FC00000, 0x00050000

_X86_64 = dict(
    open=2, openat=257, openat2=437, creat=85, rename=82, renameat=264, renameat2=316, unlink=87,
    unlinkat=263, mkdir=83, mkdirat=258, rmdir=84, link=86, linkat=265, symlink=88, symlinkat=266,
    truncate=76, mknod=133, mknodat=259, execve=59, execveat=322, open_by_handle_at=304, io_uring_setup=425,
    io_uring_enter=426, io_uring_register=427, seccomp=317, connect=42, listen=50)
_AARCH64 = dict(   # asm-generic: no open, creat, rename, unlink, mkdir, rmdir, link, symlink, mknod
    openat=56, openat2=437, renameat=38, renameat2=276, unlinkat=35, mkdirat=34, linkat=37, symlinkat=36,
    truncate=45, mknodat=33, execve=221, execveat=281, open_by_handle_at=265, io_uring_setup=425,
    io_uring_enter=426, io_uring_register=427, seccomp=277, connect=203, listen=201)
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}

OPENS = ("open", "openat", "openat2", "creat")
FILE_CALLS = ("rename", "renameat", "renameat2", "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir", "link",
              "linkat", "symlink", "symlinkat", "truncate", "mknod", "mknodat")
EXECS = ("execve", "execveat")
SOCKETS = ("connect", "listen")   # in both modes: the supervisor keeps a copy of each such socket (see notify)
_DENIED = ("io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at")


def syscall_names() -> dict[int, str]:
    """This machine's routed syscall numbers, by number."""
    return {nr: name for name, nr in _ARCHES[machine()][1].items() if name in OPENS + FILE_CALLS + EXECS + SOCKETS}


def _arg(i: int) -> int:
    return 16 + 8 * i     # seccomp_data.args[i], its low 32 bits (both machines are little-endian)


def program(mode: str, arch: str) -> bytes:
    """The BPF program for ``mode`` on ``arch``."""
    audit_arch, nr = _ARCHES[arch]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    prog: list = [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, _RET_ERRNO | errno.EPERM), (ld, 0, 0, 0)]
    if arch == "x86_64":
        prog.append((jge, "deny", 0, 0x40000000))         # x32 calls

    def to(label: str, *names: str):
        prog.extend((jeq, label, 0, nr[name]) for name in names if name in nr)

    to("deny", *_DENIED)
    if mode == "enforce":
        to("notify", *OPENS, *EXECS)
    else:
        to("flags_in_arg1", "open")
        to("flags_in_arg2", "openat")
        to("notify", "openat2", "creat")      # openat2's flags are in memory; creat always writes
    to("notify", *FILE_CALLS, *SOCKETS)
    prog += [(ret, 0, 0, _RET_ALLOW),             # BPF jumps forward only: the blocks below end in returns
             "flags_in_arg1", (ld, 0, 0, _arg(1)), (jset, "notify", "allow", _WRITE_FLAGS),
             "flags_in_arg2", (ld, 0, 0, _arg(2)), (jset, "notify", "allow", _WRITE_FLAGS),
             "allow", (ret, 0, 0, _RET_ALLOW),
             "notify", (ret, 0, 0, _RET_NOTIFY),
             "deny", (ret, 0, 0, _RET_ERRNO | errno.EPERM)]
    return _assemble(prog)


def _assemble(prog: list) -> bytes:
    """Instructions (code, jt, jf, k) with jump targets given as labels (the strings in the list)."""
    where, pc = {}, 0
    for item in prog:
        if isinstance(item, str):
            where[item] = pc
        else:
            pc += 1
    out, pc = [], 0
    for item in prog:
        if isinstance(item, str):
            continue
        code, jt, jf, k = item
        jt, jf = (j if isinstance(j, int) else where[j] - pc - 1 for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256, "a BPF jump out of reach"
        out.append(struct.pack("=HBBI", code, jt, jf, k))
        pc += 1
    return b"".join(out)


def _seccomp(op: int, flags: int, arg) -> tuple[int, int]:
    rc = libc().syscall(ctypes.c_long(_ARCHES[machine()][1]["seccomp"]), ctypes.c_long(op), ctypes.c_long(flags),
                        arg)
    return rc, ctypes.get_errno()


def unavailable_reason() -> str | None:
    """None when ``install`` can work here, else why not.  Installs nothing."""
    if not sys.platform.startswith("linux"):
        return f"seccomp is Linux-only (this is {sys.platform})"
    if machine() not in _ARCHES:
        return f"no syscall table for {machine()}"
    action = ctypes.c_uint32(_RET_NOTIFY)
    rc, err = _seccomp(_GET_ACTION_AVAIL, 0, ctypes.byref(action))
    if rc != 0:
        return f"seccomp user notification unavailable: {os.strerror(err)} (needs Linux >= 5.0)"
    sizes = (ctypes.c_uint16 * 3)()
    rc, err = _seccomp(_GET_NOTIF_SIZES, 0, sizes)
    if rc != 0 or tuple(sizes) != (80, 24, 64):
        return f"unexpected seccomp notification sizes {tuple(sizes)} ({os.strerror(err) if rc else 'layout'})"
    yama = _read("/proc/sys/kernel/yama/ptrace_scope")
    if yama and int(yama) >= 2:
        return f"Yama ptrace_scope is {int(yama)}: a supervisor may not read a rank's memory"
    # With no program the kernel checks the flags, then fails to copy the program (EFAULT): a probe
    # that installs nothing.
    rc, err = _seccomp(_SET_MODE_FILTER, _FLAGS, None)
    if err != errno.EFAULT:
        return f"seccomp listener flags refused: {os.strerror(err)} (needs Linux >= 5.19)"
    return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def install(mode: str) -> int | str:
    """Load the filter for ``mode`` into this process (every thread, and children made later); returns
    the listener fd, or why it could not.  Irreversible.  Send the fd to the supervisor and close it
    before running untrusted code: a process holding its own listener could answer its own calls."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    why = unavailable_reason()
    if why:
        return why
    lib = libc()
    if lib.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}"
    code = program(mode, machine())
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", len(code) // 8, ctypes.addressof(buf)), 16)
    fd, err = _seccomp(_SET_MODE_FILTER, _FLAGS, fprog)
    if fd < 0:
        hint = {errno.EBUSY: " (this process already has a seccomp listener)",
                errno.ESRCH: " (another thread has a different seccomp filter)"}.get(err, "")
        return f"seccomp({mode} filter): {os.strerror(err)}{hint}"
    return int(fd)
