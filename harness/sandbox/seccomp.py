"""seccomp filters: the system calls a rank (or the forkserver) may not make, whatever else confines it.

Landlock sees the filesystem only; these calls move data or escape without touching it, and they
fail with EPERM in every thread of the calling process and in its children:

* ``IPC``: System V shared memory, semaphores and message queues, POSIX message queues, the kernel
  keyrings, sethostname: channels between processes that bypass the filesystem.
* ``ESCAPE``: ptrace, process_vm_readv/writev and pidfd_getfd (reaching into another process),
  open_by_handle_at (opening any file of a mount by its handle, the classic container escape),
  setsid/setpgid (leaving the process group the judge ends), new namespaces and mounts (unshare,
  setns, mount and the new mount API, pivot_root, chroot, clone with a CLONE_NEW* flag; clone3 says
  ENOSYS so the C library falls back to clone, where the flags can be read).
* ``UNIX_SOCKETS`` (gloo ranks): socket(AF_UNIX) and socketpair(AF_UNIX).  gloo needs TCP only, so
  no rank can reach the forkserver's socket (multiprocessing authenticates nobody on Python 3.11)
  or any other Unix-socket broker.  NCCL needs Unix sockets between the ranks of a machine (its
  proxy and cuMem handle exchange), so NCCL ranks keep them.
* ``LOCKED_PRCTL``: prctl(PR_SET_PDEATHSIG) and prctl(PR_SET_DUMPABLE): the harness sets both before
  learner code runs (a rank dies with its parent; the test process can read its /proc entry).

The arch check refuses 32-bit and x32 entry points, whose numbers differ.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from .landlock import libc, machine

_SECCOMP = {"x86_64": 317, "aarch64": 277}   # the seccomp syscall's number
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NR = {   # name -> (x86_64, aarch64); None where the call does not exist on that architecture
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197), "semget": (64, 190),
    "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192), "msgget": (68, 186), "msgsnd": (69, 189),
    "msgrcv": (70, 188), "msgctl": (71, 187), "mq_open": (240, 180), "mq_unlink": (241, 181),
    "mq_timedsend": (242, 182), "mq_timedreceive": (243, 183), "mq_notify": (244, 184),
    "mq_getsetattr": (245, 185), "add_key": (248, 217), "request_key": (249, 218), "keyctl": (250, 219),
    "sethostname": (170, 161), "setdomainname": (171, 162),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438), "setsid": (112, 157), "setpgid": (109, 154), "unshare": (272, 97),
    "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "clone": (56, 220), "clone3": (435, 435), "socket": (41, 198), "socketpair": (53, 199), "prctl": (157, 167),
}
IPC = ("shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd",
       "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
       "mq_getsetattr", "add_key", "request_key", "keyctl", "sethostname", "setdomainname")
ESCAPE = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "setsid", "setpgid", "unshare",
          "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
          "fsmount", "fspick", "mount_setattr", "open_by_handle_at", "name_to_handle_at")
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
_AF_UNIX, _PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 1, 4

# classic BPF
_LD_W_ABS, _JA, _JEQ, _JGE, _JSET, _RET = 0x20, 0x05, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR_AT, _ARCH_AT, _ARG0_AT = 0, 4, 16


def _program(deny: list, unix_sockets: bool, lock_prctl: bool) -> list:
    """The filter, as (code, jt, jf, k) instructions: each rule is a block that returns EPERM (ENOSYS for
    clone3) when it matches and falls through to the next block otherwise."""
    arch = machine()
    index = 0 if arch == "x86_64" else 1
    nr = {name: numbers[index] for name, numbers in _NR.items()}
    deny_perm = _ERRNO | errno.EPERM
    prog = [(_LD_W_ABS, 0, 0, _ARCH_AT), (_JEQ, 1, 0, _AUDIT_ARCH[arch]), (_RET, 0, 0, deny_perm),
            (_LD_W_ABS, 0, 0, _NR_AT)]
    if arch == "x86_64":
        prog.append((_JGE, len(deny) + 1, 0, 0x40000000))   # x32 calls: to the deny after the list
    for i, name in enumerate(deny):
        prog.append((_JEQ, len(deny) - i, 0, nr[name]))      # to the deny after the list
    prog += [(_JA, 0, 0, 1), (_RET, 0, 0, deny_perm)]          # none matched: jump over the deny

    def on_arg0(name: str, test: int, value: int, errno_: int):
        """if nr == name and (arg0 & value if test is JSET else arg0 == value): return errno_."""
        return [(_LD_W_ABS, 0, 0, _NR_AT), (_JEQ, 0, 3, nr[name]), (_LD_W_ABS, 0, 0, _ARG0_AT),
                (test, 0, 1, value), (_RET, 0, 0, _ERRNO | errno_)]

    prog += on_arg0("clone", _JSET, _CLONE_NEW, errno.EPERM)
    prog += [(_LD_W_ABS, 0, 0, _NR_AT), (_JEQ, 0, 1, nr["clone3"]), (_RET, 0, 0, _ERRNO | errno.ENOSYS)]
    if lock_prctl:
        prog += on_arg0("prctl", _JEQ, _PR_SET_PDEATHSIG, errno.EPERM) + on_arg0("prctl", _JEQ, _PR_SET_DUMPABLE, errno.EPERM)
    if not unix_sockets:
        prog += on_arg0("socket", _JEQ, _AF_UNIX, errno.EPERM) + on_arg0("socketpair", _JEQ, _AF_UNIX, errno.EPERM)
    prog.append((_RET, 0, 0, _ALLOW))
    return prog


def restrict(unix_sockets: bool = False, lock_prctl: bool = True) -> str | None:
    """Apply the filter (IPC, ESCAPE, the locked prctls unless not ``lock_prctl``, and AF_UNIX unless
    ``unix_sockets``) to this process and its future threads and children.  None on success, else why not.
    Needs no privilege: it sets PR_SET_NO_NEW_PRIVS itself."""
    if machine() not in _SECCOMP:
        return f"no seccomp table for {platform.machine()}"
    prog = _program(list(IPC + ESCAPE), unix_sockets, lock_prctl)
    filt = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(filt, len(filt))
    fprog = ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", len(prog), ctypes.addressof(buf)), 16)
    lib = libc()
    if lib.prctl(38, 1, 0, 0, 0) != 0:   # PR_SET_NO_NEW_PRIVS
        return f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}"
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, prog): every thread
    rc = lib.syscall(ctypes.c_long(_SECCOMP[machine()]), ctypes.c_long(1), ctypes.c_long(1), fprog)
    if rc != 0:
        return f"seccomp: {os.strerror(ctypes.get_errno())}"
    return None
