"""A small seccomp filter: the IPC calls that move data between processes without touching the filesystem.

System V shared memory, semaphores and message queues, POSIX message queues, the kernel keyrings
and sethostname bypass the filesystem, so Landlock does not see them; ``deny_ipc`` makes them fail
with EPERM in every thread of the calling process (and in its children).
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from .landlock import libc, machine

_SECCOMP = {"x86_64": 317, "aarch64": 277}   # the seccomp syscall's number
_IPC_CALLS = {
    # shmget shmat shmctl shmdt semget semop semctl semtimedop msgget msgsnd msgrcv msgctl
    # mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr
    # add_key request_key keyctl sethostname setdomainname
    "x86_64": (0xC000003E, (29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71,
                            240, 241, 242, 243, 244, 245, 248, 249, 250, 170, 171)),
    "aarch64": (0xC00000B7, (194, 196, 195, 197, 190, 193, 191, 192, 186, 189, 188, 187,
                             180, 181, 182, 183, 184, 185, 217, 218, 219, 161, 162)),
}


def deny_ipc() -> str | None:
    """Deny the non-filesystem IPC calls (EPERM).  None on success, else why not."""
    arch = _IPC_CALLS.get(machine())
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
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, prog): every thread, like Landlock would want
    rc = libc().syscall(ctypes.c_long(_SECCOMP[machine()]), ctypes.c_long(1), ctypes.c_long(1), fprog)
    if rc != 0:
        return f"seccomp: {os.strerror(ctypes.get_errno())}"
    return None
