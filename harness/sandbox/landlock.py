"""Landlock, from Python: the filesystem rules that confine a rank, and the syscalls that apply them.

Landlock (Linux >= 5.13) is unprivileged and binds root too.  It only grants: a ruleset names the
access rights it handles, and each rule grants some of them beneath one path.  ``read_rules``
builds "read everything except X" as a grant on every sibling of every folder on the way down to X
(an entry created later beside X gets no rule, hence no access); ``write_rules`` grants a rank its
private folder and the few files it must write; ``restrict_self`` applies a ruleset to the calling
thread and the threads it creates later.  ``_sandbox.confine`` decides what to hide and calls these.
"""
from __future__ import annotations

import ctypes
import errno
import glob
import os
import platform
import struct
import sys

# ---- Landlock constants (include/uapi/linux/landlock.h) -------------------------------------------

_SYS = {  # (landlock_create_ruleset, landlock_add_rule, landlock_restrict_self)
    "x86_64": (444, 445, 446),
    "aarch64": (444, 445, 446),   # the asm-generic numbers
}
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# filesystem access rights, bit by bit (REFER: ABI 2, TRUNCATE: ABI 3, IOCTL_DEV: ABI 5)
(EXECUTE, WRITE_FILE, READ_FILE, READ_DIR, REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK,
 MAKE_FIFO, MAKE_BLOCK, MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV) = (1 << bit for bit in range(16))
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_FS_LATEST = (1 << 16) - 1
_FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV   # what a rule on a non-directory may hold
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0   # ABI 6
SCOPE_SIGNAL = 1 << 1                 # ABI 6

READ = EXECUTE | READ_FILE | READ_DIR
# The private folder: everything but device nodes and sockets (a socket file there would let
# another rank connect to it by path: Landlock does not check connect() on ABI <= 7).
PRIVATE = READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_FIFO | MAKE_SYM | REFER | TRUNCATE
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
SHARED_MEMORY = ("/dev/shm", "/run/shm", "/dev/mqueue")


class Unavailable(Exception):
    """Landlock cannot be applied here (the message says why)."""


def libc():
    """The C library, for raw syscalls (shared with ``_seccomp``)."""
    lib = ctypes.CDLL(None, use_errno=True)
    lib.syscall.restype = ctypes.c_long
    lib.prctl.restype = ctypes.c_int
    return lib


def machine() -> str:
    """This CPU's name as the syscall tables spell it."""
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def landlock_abi() -> int | str:
    """The kernel's Landlock ABI version (>= 1), or the reason it cannot be used."""
    if not sys.platform.startswith("linux"):
        return f"Landlock is Linux-only (this is {sys.platform})"
    nums = _SYS.get(machine())
    if nums is None:
        return f"no Landlock syscall numbers known for {platform.machine()}"
    abi = libc().syscall(ctypes.c_long(nums[0]), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if abi < 0:
        err = ctypes.get_errno()
        why = {errno.ENOSYS: "the kernel has no Landlock (Linux >= 5.13 built with CONFIG_SECURITY_LANDLOCK)",
               errno.EOPNOTSUPP: "Landlock is built into the kernel but disabled at boot (lsm= does not list it)",
               errno.EPERM: "a seccomp policy (container runtime?) denies the Landlock syscalls"}
        return f"{why.get(err, 'landlock_create_ruleset failed')} [{errno.errorcode.get(err, err)}]"
    return int(abi)


def unavailable_reason() -> str | None:
    """None when this process could be confined, else why not (for skips and status lines)."""
    abi = landlock_abi()
    return abi if isinstance(abi, str) else None


# ---- building the rules ------------------------------------------------------------------------------

def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def read_rules(hidden: list[str], gpu: bool) -> list[tuple[str, int]]:
    """Read access to the whole tree except ``hidden``, ``/dev`` (a few devices) and ``/proc`` (own pid).

    Landlock only grants, so "all but X" is granted as: every sibling of every folder on the way
    down to X, recursively.  Entries created later beside X get no rule, hence no access.
    """
    rules: list[tuple[str, int]] = []
    carve = set(hidden) | {"/dev", "/proc"}

    def visit(folder: str):
        if folder in hidden:
            return
        if folder == "/proc":
            rules.extend(_proc_rules())
            return
        if folder == "/dev":
            rules.extend(_dev_rules(gpu))
            return
        if not any(_under(c, folder) for c in carve):
            rules.append((folder, READ))
            return
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            try:
                if entry.is_symlink():
                    continue          # reached through its target, which has its own rule (or none)
                if entry.is_dir():
                    visit(entry.path)
                elif entry.is_file():
                    rules.append((entry.path, READ & _FILE_ONLY))
            except OSError:
                continue

    visit("/")
    return rules


def _proc_rules() -> list[tuple[str, int]]:
    """/proc without the other processes: their cmdline, comm, environ and fds stay out of reach."""
    rules = []
    me = str(os.getpid())
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and entry.name != me:
            continue
        try:
            if entry.is_symlink():
                continue          # self, thread-self, mounts, net: they resolve into /proc/<own pid>
            rules.append((entry.path, READ if entry.is_dir() else READ & _FILE_ONLY))
        except OSError:
            continue
    return rules


def _dev_rules(gpu: bool) -> list[tuple[str, int]]:
    rules = [(d, READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV) for d in _DEVICES if os.path.exists(d)]
    if gpu:   # NCCL: the GPU device files, and /dev/shm for its shared-memory transport
        rules += [(d, READ_FILE | WRITE_FILE | IOCTL_DEV) for d in glob.glob("/dev/nvidia*") if not os.path.isdir(d)]
        rules += [(d, READ) for d in glob.glob("/dev/nvidia*") if os.path.isdir(d)]
        rules += [(d, PRIVATE | MAKE_SOCK) for d in SHARED_MEMORY if os.path.isdir(d)]
    return rules


def write_rules(private_dir: str, writable: list[str]) -> list[tuple[str, int]]:
    rules = [(private_dir, PRIVATE)]
    for path in writable:
        rules.append((path, PRIVATE if os.path.isdir(path) else READ_FILE | WRITE_FILE | TRUNCATE))
    return rules


def _ruleset(abi: int, rules: list[tuple[str, int]], scoped: int) -> tuple[int, list[int]]:
    """Create the ruleset; returns (ruleset fd, fds to keep open).  Raises Unavailable."""
    lib = libc()
    create, add_rule, _ = _SYS[machine()]
    handled = _FS_BY_ABI.get(abi, _FS_LATEST)
    scoped = scoped if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled, 0, scoped) if abi >= 6 else struct.pack("=Q", handled)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = lib.syscall(ctypes.c_long(create), buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise Unavailable(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    keep = []
    try:
        for path, access in rules:
            access &= handled
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue                 # gone since it was listed
            if not os.path.isdir(path):
                access &= _FILE_ONLY
            rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
            rc = lib.syscall(ctypes.c_long(add_rule), ctypes.c_long(ruleset), ctypes.c_long(_RULE_PATH_BENEATH),
                             rule, ctypes.c_uint32(0))
            err = ctypes.get_errno()
            if path.startswith("/proc/") and path[6:].isdigit():
                keep.append(fd)          # procfs makes a new inode if this dentry is dropped: pin it
            else:
                os.close(fd)
            if rc < 0:
                raise Unavailable(f"landlock_add_rule({path}): {os.strerror(err)}")
    except BaseException:
        os.close(ruleset)
        for fd in keep:
            os.close(fd)
        raise
    return ruleset, keep


def _restrict(ruleset: int):
    lib = libc()
    if lib.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise Unavailable(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    rc = lib.syscall(ctypes.c_long(_SYS[machine()][2]), ctypes.c_long(ruleset), ctypes.c_uint32(0))
    if rc < 0:
        raise Unavailable(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")


def restrict_self(abi: int, rules: list[tuple[str, int]], scoped: int) -> list[int]:
    """Confine this thread and the threads it creates from now on to ``rules``; ``scoped`` (ABI >= 6)
    also keeps abstract Unix sockets and signals inside the sandbox.  Returns the fds that must stay
    open (the /proc/<own pid> rule's).  Raises Unavailable, having changed nothing."""
    ruleset, pinned = _ruleset(abi, rules, scoped)
    try:
        _restrict(ruleset)
    except Unavailable:
        for fd in pinned:
            os.close(fd)
        raise
    finally:
        os.close(ruleset)
    return pinned
