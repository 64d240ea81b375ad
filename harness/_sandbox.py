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
"""
from __future__ import annotations

import ctypes
import errno
import glob
import os
import platform
import struct
import sys
import tempfile

_PINNED: list[int] = []   # O_PATH fds that keep the /proc/<own pid> rule's dentry (and so its inode) alive
# What confine() did in this process: None (never called), "confined: ..." or "unavailable: ...".
STATUS: str | None = None

# ---- Landlock constants (include/uapi/linux/landlock.h) -------------------------------------------

_SYS = {  # (landlock_create_ruleset, landlock_add_rule, landlock_restrict_self, seccomp)
    "x86_64": (444, 445, 446, 317),
    "aarch64": (444, 445, 446, 277),   # the asm-generic numbers
}
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13        # ABI 2
TRUNCATE = 1 << 14     # ABI 3
IOCTL_DEV = 1 << 15    # ABI 5
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
_SHARED_MEMORY = ("/dev/shm", "/run/shm", "/dev/mqueue")

# ---- seccomp: calls that move data between processes without touching the filesystem ---------------

_IPC_CALLS = {
    # shmget shmat shmctl shmdt semget semop semctl semtimedop msgget msgsnd msgrcv msgctl
    # mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr
    # add_key request_key keyctl sethostname setdomainname
    "x86_64": (0xC000003E, (29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71,
                            240, 241, 242, 243, 244, 245, 248, 249, 250, 170, 171)),
    "aarch64": (0xC00000B7, (194, 196, 195, 197, 190, 193, 191, 192, 186, 189, 188, 187,
                             180, 181, 182, 183, 184, 185, 217, 218, 219, 161, 162)),
}


class _Unavailable(Exception):
    pass


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def _machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def landlock_abi() -> int | str:
    """The kernel's Landlock ABI version (>= 1), or the reason it cannot be used."""
    if not sys.platform.startswith("linux"):
        return f"Landlock is Linux-only (this is {sys.platform})"
    nums = _SYS.get(_machine())
    if nums is None:
        return f"no Landlock syscall numbers known for {platform.machine()}"
    libc = _libc()
    abi = libc.syscall(ctypes.c_long(nums[0]), None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
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


def _read_rules(hidden: list[str], gpu: bool) -> list[tuple[str, int]]:
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
        rules += [(d, PRIVATE | MAKE_SOCK) for d in _SHARED_MEMORY if os.path.isdir(d)]
    return rules


def _write_rules(private_dir: str, writable: list[str]) -> list[tuple[str, int]]:
    rules = [(private_dir, PRIVATE)]
    for path in writable:
        rules.append((path, PRIVATE if os.path.isdir(path) else READ_FILE | WRITE_FILE | TRUNCATE))
    return rules


def _landlock(abi: int, rules: list[tuple[str, int]], scoped: int) -> tuple[int, list[int]]:
    """Create the ruleset; returns (ruleset fd, fds to keep open).  Raises _Unavailable."""
    libc = _libc()
    create, add_rule, _restrict, _ = _SYS[_machine()]
    handled = _FS_BY_ABI.get(abi, _FS_LATEST)
    scoped = scoped if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled, 0, scoped) if abi >= 6 else struct.pack("=Q", handled)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(ctypes.c_long(create), buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _Unavailable(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
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
            rc = libc.syscall(ctypes.c_long(add_rule), ctypes.c_long(ruleset), ctypes.c_long(_RULE_PATH_BENEATH),
                              rule, ctypes.c_uint32(0))
            err = ctypes.get_errno()
            if path.startswith("/proc/") and path[6:].isdigit():
                keep.append(fd)          # procfs makes a new inode if this dentry is dropped: pin it
            else:
                os.close(fd)
            if rc < 0:
                raise _Unavailable(f"landlock_add_rule({path}): {os.strerror(err)}")
    except BaseException:
        os.close(ruleset)
        for fd in keep:
            os.close(fd)
        raise
    return ruleset, keep


def _restrict(ruleset: int):
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _Unavailable(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    rc = libc.syscall(ctypes.c_long(_SYS[_machine()][2]), ctypes.c_long(ruleset), ctypes.c_uint32(0))
    if rc < 0:
        raise _Unavailable(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")


def _seccomp_ipc() -> str | None:
    """Deny the non-filesystem IPC calls (EPERM).  None on success, else why not."""
    arch = _IPC_CALLS.get(_machine())
    if arch is None:
        return f"no seccomp table for {platform.machine()}"
    audit_arch, calls = arch
    ld_w_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM
    prog = [(ld_w_abs, 0, 0, 4),                       # A = seccomp_data.arch
            (jeq, 1, 0, audit_arch),                   # native: go on; else deny (32-bit entry points)
            (ret, 0, 0, deny),
            (ld_w_abs, 0, 0, 0)]                       # A = seccomp_data.nr
    if audit_arch == 0xC000003E:
        prog.append((jge, len(calls) + 1, 0, 0x40000000))   # x32 calls: deny
    for i, nr in enumerate(calls):
        prog.append((jeq, len(calls) - i, 0, nr))    # jump to the deny at the end
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    filt = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(filt, len(filt))
    fprog = ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", len(prog), ctypes.addressof(buf)), 16)
    libc = _libc()
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, prog): every thread, like Landlock would want
    rc = libc.syscall(ctypes.c_long(_SYS[_machine()][3]), ctypes.c_long(1), ctypes.c_long(1), fprog)
    if rc != 0:
        return f"seccomp: {os.strerror(ctypes.get_errno())}"
    return None


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
        hide |= {os.path.realpath(p) for p in _SHARED_MEMORY if os.path.exists(p)}
    # a folder above the private one would also grant it to other ranks: refuse rather than leak
    hide = {h for h in hide if h != "/"}
    threads = len(os.listdir("/proc/self/task"))
    rules = _read_rules(sorted(hide), gpu)
    rules += [(os.path.realpath(r), READ) for r in readable]
    rules += _write_rules(private_dir, [os.path.realpath(w) for w in writable] +
                          ([os.path.realpath(store_file)] if store_file else []))
    scoped = 0 if gpu else SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    try:
        ruleset, pinned = _landlock(abi, rules, scoped)
        try:
            _restrict(ruleset)
        except _Unavailable:
            for fd in pinned:
                os.close(fd)
            raise
        finally:
            os.close(ruleset)
    except _Unavailable as e:
        STATUS = f"unavailable: {e}"
        return str(e)
    _PINNED.extend(pinned)
    done = [f"Landlock ABI {abi}"]
    if abi < 6:
        done.append("abstract sockets and signals not scoped (needs ABI 6)")
    if seccomp:
        why = _seccomp_ipc()
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
