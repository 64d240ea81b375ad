"""What a routed call means, and carrying it out: the supervisor's side of ``notify``, below the rules.

``decode`` turns one notification into a ``Call``: its operation and its paths, canonical (absolute,
every symlink followed as the kernel would follow it).  ``Caller`` is the calling thread as the
supervisor sees it -- its memory, its /proc entries, its umask -- and opens or changes files on its
behalf in mode "enforce".
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import stat
import struct
from dataclasses import dataclass

from .._landlock import libc

_LIBC = libc()
_OPENAT2 = 437                              # the same on x86_64 and aarch64
_AT_FDCWD = -100
_AT_REMOVEDIR, _AT_SYMLINK_NOFOLLOW, _AT_SYMLINK_FOLLOW, _AT_EMPTY_PATH = 0x200, 0x100, 0x400, 0x1000
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH, _RESOLVE_IN_ROOT = 0x02, 0x04, 0x08, 0x10
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_MAX, _MAX_LINKS = 4096, 40
_DELETED = " (deleted)"                      # how /proc/<pid>/fd/<n> names a file that was removed

# name: (operation, ((dirfd argument, or None for AT_FDCWD; path argument), ...), flags argument, mode argument)
_CALLS = {
    "open": ("open", ((None, 0),), 1, 2), "openat": ("open", ((0, 1),), 2, 3),
    "openat2": ("open", ((0, 1),), None, None), "creat": ("open", ((None, 0),), None, 1),
    "rename": ("rename", ((None, 0), (None, 1)), None, None), "renameat": ("rename", ((0, 1), (2, 3)), None, None),
    "renameat2": ("rename", ((0, 1), (2, 3)), 4, None),
    "unlink": ("remove", ((None, 0),), None, None), "unlinkat": ("remove", ((0, 1),), 2, None),
    "mkdir": ("mkdir", ((None, 0),), None, 1), "mkdirat": ("mkdir", ((0, 1),), None, 2),
    "rmdir": ("rmdir", ((None, 0),), None, None),
    "link": ("link", ((None, 0), (None, 1)), None, None), "linkat": ("link", ((0, 1), (2, 3)), 4, None),
    "symlink": ("symlink", ((None, 1),), None, None), "symlinkat": ("symlink", ((1, 2),), None, None),
    "truncate": ("truncate", ((None, 0),), None, None),
    "mknod": ("mknod", ((None, 0),), None, 1), "mknodat": ("mknod", ((0, 1),), None, 2),
    "execve": ("exec", ((None, 0),), None, None), "execveat": ("exec", ((0, 1),), 4, None),
}


@dataclass
class Call:
    """One routed call, decoded.  ``magic[i]`` is None, or -- when path i is a /proc/<pid>/fd/<n> link to
    no path (a pipe, a socket, a deleted file) -- what the link names, "pipe:[4242]"."""
    op: str            # open rename remove rmdir mkdir link symlink truncate mknod exec
    paths: list
    magic: list
    flags: int = 0     # O_* for open, AT_* for link and exec, RENAME_* for rename
    mode: int = 0
    extra: object = None   # symlink: its target; truncate: the length; mknod: the device

    @property
    def writes(self) -> bool:
        return self.op != "exec" and (self.op != "open" or bool(self.flags & _WRITE_FLAGS))


def decode(name: str, args: tuple, caller: Caller) -> Call:
    """The call ``name(*args)`` made by ``caller``.  Raises OSError where the kernel would fail it."""
    op, operands, flags_at, mode_at = _CALLS[name]
    flags = 0 if flags_at is None else args[flags_at] & 0xFFFFFFFF
    mode = 0 if mode_at is None else args[mode_at] & 0xFFFFFFFF
    how = 0
    if name == "creat":
        flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
    elif name == "openat2":
        flags, mode, how = caller.open_how(args[2], args[3])
    if op == "remove" and flags & _AT_REMOVEDIR:
        op = "rmdir"
    call = Call(op, [], [], flags, mode)
    if op == "symlink":
        call.extra = caller.string(args[0])           # the link's target: data, not a path walked now
    elif op == "truncate":
        call.extra = ctypes.c_int64(args[1]).value
    elif op == "mknod":
        call.extra = args[mode_at + 1]
    for i, (dirfd_at, path_at) in enumerate(operands):
        dirfd = _AT_FDCWD if dirfd_at is None else ctypes.c_int32(args[dirfd_at]).value
        empty_ok = op in ("link", "exec") and bool(flags & _AT_EMPTY_PATH)
        path, magic = caller.resolve(dirfd, caller.string(args[path_at]), _follows(op, flags, i), empty_ok, how)
        call.paths.append(path)
        call.magic.append(magic)
    return call


def _follows(op: str, flags: int, i: int) -> bool:
    """Whether the kernel follows a symlink in the last component of operand i."""
    if op == "open":
        return not flags & os.O_NOFOLLOW and flags & (os.O_CREAT | os.O_EXCL) != os.O_CREAT | os.O_EXCL
    if op == "link":
        return i == 0 and bool(flags & _AT_SYMLINK_FOLLOW)
    if op == "exec":
        return not flags & _AT_SYMLINK_NOFOLLOW
    return op == "truncate"


def resolve(path: str, base: str, follow: bool, readlink, root: str = "/") -> tuple[str, str | None, int]:
    """``path`` walked from ``base`` as the kernel walks it: (canonical path, magic, symlinks followed).

    ``readlink(p)`` is a symlink's target or None.  The last component's symlink is followed only with
    ``follow`` (or a trailing slash); ``..`` never rises above ``root``; a walk that ends on a /proc
    link to no path returns that link and what it names (``magic``)."""
    floor = _parts(root)
    parts = list(floor) if path.startswith("/") else _parts(base)
    todo = _parts(path)[::-1]
    follow = follow or path.endswith("/")
    links = 0
    while todo:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            if len(parts) > len(floor):
                parts.pop()
            continue
        here = "/" + "/".join(parts + [name])
        last = all(rest == "." for rest in todo)
        target = readlink(here) if follow or not last else None
        if target is None:
            parts.append(name)
            continue
        links += 1
        if links > _MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        if here.startswith("/proc/") and _names_no_path(target):
            if not last:
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), here)
            return here, target, links
        if target.startswith("/"):
            parts = list(floor)
        todo.extend(_parts(target)[::-1])
    return "/" + "/".join(parts), None, links


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def _names_no_path(target: str) -> bool:
    """A /proc link's target that is no path to walk: "pipe:[12]", "socket:[3]", "/tmp/x (deleted)"."""
    return target.endswith(_DELETED) or (not target.startswith("/") and ":" in target)


def rule_path(path: str, magic: str | None) -> str | None:
    """The path the rules judge: ``path``, or for a /proc fd link to a deleted file the path it had
    (as Landlock judges it); None for a pipe, a socket or another object that never had a path."""
    if magic is None:
        return path
    return magic[:-len(_DELETED)] if magic.endswith(_DELETED) else None


def under(path: str, roots) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


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
