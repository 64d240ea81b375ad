"""The calling thread as the supervisor sees it: its memory, its /proc entries, its umask; and, in mode
"enforce", the file call carried out on its behalf (``Caller.open`` / ``Caller.apply``)."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import stat
import struct

from ._notify_paths import (_AT_FDCWD, _DELETED, _LIBC, _OPENAT2, _PATH_MAX, _RESOLVE_BENEATH, _RESOLVE_IN_ROOT,
                            _RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, Call, _names_no_path, resolve)


def open_dir(path: str) -> tuple[int, str]:
    """(O_PATH fd of ``path``'s folder, last component).  The folder is reached without following any
    symlink: ``path`` is canonical, so a symlink on the way is one swapped in since the check."""
    folder, name = os.path.split(path)
    if not name:
        folder, name = "/", "."
    how = struct.pack("=QQQ", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0, _RESOLVE_NO_SYMLINKS)
    fd = _LIBC.syscall(ctypes.c_long(_OPENAT2), ctypes.c_long(_AT_FDCWD), os.fsencode(folder), how,
                       ctypes.c_size_t(len(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), folder)
    return fd, name


@contextlib.contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


class Caller:
    """The calling thread, seen from the supervisor: its memory, /proc entries and umask."""

    def __init__(self, tid: int):
        self.tid = tid
        self._mem: int | None = None
        self._status: dict | None = None

    def close(self):
        if self._mem is not None:
            os.close(self._mem)
            self._mem = None

    def _field(self, name: str) -> str:
        if self._status is None:
            with open(f"/proc/{self.tid}/status") as f:
                self._status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        return self._status[name]

    @property
    def tgid(self) -> int:
        return int(self._field("Tgid"))

    @property
    def umask(self) -> int:
        return int(self._field("Umask"), 8)

    # ---- reading the call's arguments ------------------------------------------------------------

    def read(self, address: int, size: int) -> bytes:
        if self._mem is None:
            self._mem = os.open(f"/proc/{self.tid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(self._mem, size, address)     # a short read stops where the mapping ends
        except (OSError, OverflowError):
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT)) from None

    def string(self, address: int) -> str:
        data = self.read(address, 256)                   # most paths: a shorter copy
        if b"\0" not in data and len(data) == 256:
            data = self.read(address, _PATH_MAX)
        end = data.find(b"\0")
        if end < 0:
            raise OSError(errno.ENAMETOOLONG if len(data) == _PATH_MAX else errno.EFAULT, "path argument")
        return os.fsdecode(data[:end])

    def open_how(self, address: int, size: int) -> tuple[int, int, int]:
        """openat2's struct open_how: (flags, mode, resolve)."""
        if size < 24:
            raise OSError(errno.EINVAL, "open_how too small")
        data = self.read(address, min(size, _PATH_MAX))
        if len(data) < min(size, _PATH_MAX):
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
        if any(data[24:]):
            raise OSError(errno.E2BIG, "open_how fields this supervisor does not know")
        return struct.unpack("=QQQ", data[:24])

    # ---- resolving -------------------------------------------------------------------------------

    def _fd_link(self, dirfd: int) -> tuple[str, str]:
        link = f"/proc/{self.tid}/cwd" if dirfd == _AT_FDCWD else f"/proc/{self.tid}/fd/{dirfd}"
        try:
            return link, os.readlink(link)
        except FileNotFoundError:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF)) from None

    def readlink(self, path: str) -> str | None:
        if path == "/proc/self":                      # the caller's, not the supervisor's
            return str(self.tgid)
        if path == "/proc/thread-self":
            return f"{self.tgid}/task/{self.tid}"
        try:
            return os.readlink(path)
        except OSError:
            return None

    def resolve(self, dirfd: int, path: str, follow: bool, empty_ok: bool, how: int) -> tuple[str, str | None]:
        """(canonical path, magic) of ``path`` from ``dirfd``; ``how``: openat2's RESOLVE_* flags."""
        if not path:
            if not empty_ok:
                raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
            link, target = self._fd_link(dirfd)       # AT_EMPTY_PATH: the fd itself
            return (link, target) if _names_no_path(target) else (target, None)
        beneath = how & (_RESOLVE_BENEATH | _RESOLVE_IN_ROOT)
        base = "/"
        if beneath or not path.startswith("/"):
            _, base = self._fd_link(dirfd)
            if _names_no_path(base):
                raise OSError(errno.ENOENT if base.endswith(_DELETED) else errno.ENOTDIR, base)
        canonical, magic, links = resolve(path, base, follow, self.readlink, base if beneath else "/")
        if (links and how & _RESOLVE_NO_SYMLINKS) or (magic is not None and how & _RESOLVE_NO_MAGICLINKS):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        return canonical, magic

    def foreign_proc(self, path: str) -> bool:
        """Whether ``path`` is in another process's /proc/<pid>."""
        parts = path.split("/", 3)
        if len(parts) < 3 or parts[1] != "proc" or not parts[2].isdigit():
            return False
        pid = int(parts[2])
        return pid not in (self.tid, self.tgid) and not os.path.exists(f"/proc/{self.tgid}/task/{pid}")

    # ---- carrying calls out (mode "enforce") -----------------------------------------------------

    def open(self, call: Call) -> int:
        """Open ``call``'s file here, as the caller asked: the fd to inject into it.  The supervisor
        opens with O_NONBLOCK, so that it never waits (on a FIFO's other end), then clears it."""
        flags, (path,), (magic,) = call.flags, call.paths, call.magic
        plain = not flags & os.O_PATH
        if magic is not None:
            fd = self._reopen(path, magic, flags)
        else:
            folder, name = open_dir(path)
            creating = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE
            mine = flags | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_NONBLOCK if plain else 0)
            try:
                with _umask(self.umask) if creating else contextlib.nullcontext():
                    fd = os.open(name, mine, call.mode & 0o7777, dir_fd=folder)
            finally:
                os.close(folder)
        try:
            if plain and not flags & os.O_NONBLOCK:
                if magic is None and flags & 3 == os.O_RDONLY and stat.S_ISFIFO(os.fstat(fd).st_mode):
                    raise OSError(errno.EACCES, "a FIFO opened for reading without O_NONBLOCK (it would wait "
                                  "for a writer; the supervisor cannot)", path)
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _reopen(self, link: str, names: str, flags: int) -> int:
        """Reopen what a /proc fd link names, and check it still names that (the caller may have dup2'd
        another file onto the fd since); O_TRUNC only once the check passed."""
        fd = os.open(link, (flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC)) | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != names:
                raise OSError(errno.EACCES, "the fd changed while the call was checked", link)
            if flags & os.O_TRUNC and stat.S_ISREG(os.fstat(fd).st_mode):
                os.ftruncate(fd, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def apply(self, call: Call):
        """Carry out a call other than open here, on the checked paths."""
        folders = []
        try:
            for path in call.paths:
                folders.append(open_dir(path))
            (d0, n0), (d1, n1) = folders[0], folders[-1]
            if call.op == "remove":
                os.unlink(n0, dir_fd=d0)
            elif call.op == "rmdir":
                os.rmdir(n0, dir_fd=d0)
            elif call.op == "rename":
                _rename(d0, n0, d1, n1, call.flags)
            elif call.op == "link":
                os.link(n0, n1, src_dir_fd=d0, dst_dir_fd=d1, follow_symlinks=False)
            elif call.op == "truncate":
                _truncate(d0, n0, call.extra)
            else:
                with _umask(self.umask):
                    _create(call, d0, n0)
        finally:
            for fd, _ in folders:
                os.close(fd)


def _rename(d0: int, n0: str, d1: int, n1: str, flags: int):
    if not flags:
        return os.rename(n0, n1, src_dir_fd=d0, dst_dir_fd=d1)
    if _LIBC.renameat2(d0, os.fsencode(n0), d1, os.fsencode(n1), ctypes.c_uint(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), n1)


def _truncate(folder: int, name: str, length: int):
    fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    try:
        os.ftruncate(fd, length)
    finally:
        os.close(fd)


def _create(call: Call, folder: int, name: str):
    if call.op == "mkdir":
        os.mkdir(name, call.mode & 0o7777, dir_fd=folder)
    elif call.op == "symlink":
        os.symlink(call.extra, name, dir_fd=folder)
    elif stat.S_IFMT(call.mode) in (stat.S_IFCHR, stat.S_IFBLK):
        raise OSError(errno.EPERM, "device nodes")
    else:
        os.mknod(name, call.mode, call.extra, dir_fd=folder)
