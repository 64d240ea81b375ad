"""Passing a rank's listener fd to the test process, over a socket the rank already holds (SCM_RIGHTS).

The rank may not make new Unix sockets (the sandbox's seccomp filter), so the fd travels on its pipe
to the test process, as the first message there.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct

from ._notify_filter import install
from .landlock import libc

_PIDFD_GETFD = 438   # the same on x86_64 and aarch64


def send_fd(sock_fd: int, fd: int | None, reason: str = ""):
    """Send ``fd`` over the connected AF_UNIX socket ``sock_fd`` (SCM_RIGHTS), or with None, ``reason``."""
    payload = reason.encode(errors="replace")[:0xFFFF]
    rights = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("=i", fd))]
    with socket.socket(fileno=os.dup(sock_fd)) as sock:
        sock.sendmsg([struct.pack("=H", len(payload)) + payload], rights)


def recv_fd(sock_fd: int) -> tuple[int | None, str]:
    """(the fd that ``send_fd`` sent over ``sock_fd`` (close-on-exec here) or None, the text it came with).
    Call it where the protocol expects that message: it reads exactly that message's bytes."""
    with socket.socket(fileno=os.dup(sock_fd)) as sock:
        head, ancillary, _, _ = sock.recvmsg(2, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC | socket.MSG_WAITALL)
        if len(head) != 2:
            raise ConnectionError("the socket closed before the listener fd came")
        (size,) = struct.unpack("=H", head)
        reason = sock.recv(size, socket.MSG_WAITALL).decode(errors="replace") if size else ""
    fds = [struct.unpack("=i", data[:4])[0] for level, kind, data in ancillary
           if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS]
    return (fds[0] if fds else None), reason


def hand_over(sock_fd: int, mode: str) -> str | None:
    """In the rank: install the filter, send the listener fd over ``sock_fd`` (with ``mode`` as its text) and
    close it here (a process holding its own listener could answer its own calls).  None on success, else
    why not (also sent, without an fd)."""
    fd = install(mode)
    if isinstance(fd, str):
        send_fd(sock_fd, None, fd)
        return fd
    try:
        send_fd(sock_fd, fd, mode)
    finally:
        os.close(fd)
    return None


def take_fd(tid: int, fd: int) -> int | None:
    """A copy, in this process, of thread ``tid``'s process's descriptor ``fd`` (pidfd_getfd, Linux >= 5.6;
    it needs ptrace access to the process: root, or an ancestor under Yama's default); None if it is gone."""
    try:
        with open(f"/proc/{tid}/status") as f:
            tgid = next(int(line.split()[1]) for line in f if line.startswith("Tgid:"))
        pidfd = os.pidfd_open(tgid)
    except (OSError, StopIteration):
        return None
    try:
        copy = libc().syscall(ctypes.c_long(_PIDFD_GETFD), ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0))
        return copy if copy >= 0 else None
    finally:
        os.close(pidfd)
