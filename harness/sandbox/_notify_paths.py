"""What a routed call means: the supervisor's side of ``notify``, below the rules.

``decode`` turns one notification into a ``Call``: its operation and its paths, canonical (absolute,
every symlink followed as the kernel would follow it), reading the caller's memory through a
``_notify_caller.Caller``.
"""
from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass

from .landlock import libc

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


def decode(name: str, args: tuple, caller) -> Call:
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
