"""File events and path rules enforced below Python: a seccomp user-notification filter and its supervisor.

A rank installs the filter (``install``) and hands the listener fd to the test process
(``hand_over`` / ``send_fd``, over a socket it already has); from then on its file calls -- and its
children's -- wait in the kernel until the test process's ``Supervisor`` answers them.  Python,
ctypes, C++ and child processes all go through the same system calls, so nothing is missed, and the
decision is made outside the rank, where learner code cannot see it coming.

The supervisor reads the path arguments from the caller's memory (``/proc/<tid>/mem``), resolves them
as the kernel would (relative to ``/proc/<tid>/cwd`` or the dirfd's ``/proc/<tid>/fd/<n>``; every
symlink followed, the last one only where the call follows it; the caller's ``/proc/self``), checks
that the call is still pending (SECCOMP_IOCTL_NOTIF_ID_VALID: the tid still names the caller), and
then, in order:

* ``hidden`` (mode "enforce"): any path under these (and another process's /proc) is refused, EACCES;
* ``writable`` (mode "enforce"): a call that writes, creates, renames, removes or links outside these
  roots is refused, EACCES (a rename's or link's source too: else a hard link would give a writable
  name to a file outside);
* ``count_under``: an allowed write event under this folder is appended to ``events`` (an open for
  writing, a rename by destination, a remove, mkdir, rmdir, link, symlink, truncate or mknod; counted
  when asked for, as the audit hooks of ``harness.faults`` count, whether or not it then succeeds), and
  ``kill_at=(n, pid)`` SIGKILLs ``pid`` (None: the caller's process; the caller's process too when it
  is another one) at the n-th, without answering, so the call never runs.  With
  ``kill_after_write`` the n-th event runs and the kill comes at the next routed call, so the file is
  left as written so far (and when no routed call comes, no kill: ``killed`` stays None).

Mode "events" (Landlock enforces the rules) only counts: allowed calls get
SECCOMP_USER_NOTIF_FLAG_CONTINUE.  CONTINUE has a known hole: the kernel reads the path from the
caller's memory again, and another thread can rewrite it between the check and that read.  It costs
the count only (Landlock still applies), so mode "events" keeps it.  Mode "enforce" closes it: the
supervisor carries the call out itself, on its own copy of the path, and answers with the result --
an open through SECCOMP_IOCTL_NOTIF_ADDFD (the supervisor opens the file and the kernel installs the
fd in the caller, atomically with the answer), the other calls with their dirfd forms.  The
canonical path is opened with RESOLVE_NO_SYMLINKS, so a symlink swapped in since the check fails
the call instead of redirecting it.  Only execve still uses CONTINUE (its TOCTOU remains).

Assumptions and limits.  A routed call waits for the test process: it must call ``handle_ready``
whenever the fd is readable, also while it waits for anything else.  The rank must not keep the
listener fd (``hand_over`` closes it).  The supervisor runs as the ranks' user (what it creates, it
owns; it applies the caller's umask) in their mount namespace, and the sandbox's own seccomp filter
keeps ranks from new namespaces, ptrace and prctl(PR_SET_DUMPABLE); io_uring and open_by_handle_at,
which reach files with no path to check, fail with EPERM here.  In mode "enforce" a FIFO cannot be
opened for reading without O_NONBLOCK (the supervisor would wait for a writer), a
``/proc/<pid>/fd/<n>`` link of a pipe or deleted file cannot be hard-linked, and reopening a file
through its /proc fd link reopens it by path.  Calls that are not routed (stat, access, readlink,
chdir, getxattr) still see whether a hidden path exists, never what it holds.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import struct
from dataclasses import dataclass, field

from ._acting import acting_as
from ._notify_filter import install, syscall_names, unavailable_reason
from ._notify_caller import Caller
from ._notify_fds import hand_over, recv_fd, send_fd, take_fd  # noqa: F401  (part of this module's API)
from ._notify_paths import decode, rule_path, under
from ._notify_rules import Event, Rules

__all__ = ["Rules", "Event", "Supervisor", "install", "hand_over", "send_fd", "recv_fd", "unavailable_reason"]


def _ioc(write_read: int, nr: int, size: int) -> int:
    return (write_read << 30) | (size << 16) | (ord("!") << 8) | nr


_RECV, _SEND, _ID_VALID, _ADDFD = _ioc(3, 0, 80), _ioc(3, 1, 24), _ioc(1, 2, 8), _ioc(1, 3, 24)
_NOTIF, _RESP, _ADDFD_ARGS = "=QIIiIQ6Q", "=QqiI", "=QIIII"
_CONTINUE, _ADDFD_SEND = 1, 2
_WHAT = {"rename": "rename to", "remove": "remove", "rmdir": "rmdir", "mkdir": "mkdir", "link": "link",
         "symlink": "symlink", "truncate": "truncate", "mknod": "mknod", "exec": "exec"}


@dataclass
class Supervisor:
    """Answers the calls of the processes under one listener fd; ``handle_ready`` never blocks.  One
    thread at a time: it is meant for the test process's wait loop, beside the rank pipes."""
    listener_fd: int
    rules: Rules
    events: list = field(default_factory=list)       # counted Events, in order
    denied: list = field(default_factory=list)       # refused Events (mode "enforce")
    killed: Event | None = None                      # the event the kill came at (or after)
    sockets: list = field(default_factory=list)      # our copies of the sockets the processes connected
    handled: int = 0                                 # notifications received
    done: bool = False                               # every process under the filter has exited

    def __post_init__(self):
        self._names = syscall_names()
        self._poll = select.poll()
        self._poll.register(self.listener_fd, select.POLLIN)
        self._doomed: tuple | None = None            # kill_after_write: (pid, event) to kill at the next call
        self._killed_pids: set[int] = set()

    def fileno(self) -> int:
        return self.listener_fd

    def close(self):
        """Close the listener (pending and later routed calls fail with ENOSYS) and the sockets it holds."""
        if self.listener_fd >= 0:
            os.close(self.listener_fd)
            self.listener_fd = -1
        for fd in self.sockets:
            os.close(fd)
        self.sockets = []

    def reset(self, rules: Rules):
        """New rules for the rank's next call (a pooled rank outlives one call): counting starts again."""
        self.rules, self.events, self.denied, self.killed, self._doomed = rules, [], [], None, None

    def describe(self, event: Event) -> str:
        """"open for writing ckpt/step_2/rank_1.pt.tmp": the path from the counted folder's parent."""
        root = self.rules.count_under
        shown = os.path.relpath(event.path, os.path.dirname(root)) if root else event.path
        return f"{event.what} {shown}"

    def handle_ready(self, limit: int = 64) -> bool:
        """Answer up to ``limit`` pending calls (the fd stays readable while more wait); False once no
        process uses the filter any more (``done``: they have all exited)."""
        for _ in range(limit):
            ready = self._poll.poll(0)
            if not ready:
                return True
            if not ready[0][1] & select.POLLIN:
                self.done = True
                return False
            raw = bytearray(struct.calcsize(_NOTIF))
            try:
                fcntl.ioctl(self.listener_fd, _RECV, raw, True)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.EINTR):
                    continue                         # the caller died (or was interrupted) before we read it
                raise
            self.handled += 1
            self._answer(*struct.unpack(_NOTIF, raw))
        return True

    # ---- one notification --------------------------------------------------------------------------

    def _answer(self, nid, tid, _flags, nr, _arch, _ip, *args):
        if self._names[nr] in ("connect", "listen"):
            return self._hold_socket(nid, tid, args[0])
        caller = Caller(tid)
        enforce = self.rules.mode == "enforce"
        try:
            try:
                call = decode(self._names[nr], args, caller)
                refusal = self._refusal(call, caller) if enforce else None
                stale = bool(self._killed_pids) and caller.tgid in self._killed_pids
            except OSError as e:             # an unreadable argument, a bad dirfd, no such path...
                call, failure, stale = None, e.errno or errno.EACCES, False
            if stale or not self._valid(nid):
                return                       # dying (killed here), or gone: its tid may name another thread now
            if self._doomed is not None:
                return self._kill(*self._doomed, caller)
            if call is None:                 # the kernel fails it the same way
                return self._send(nid, error=failure) if enforce else self._send(nid, flags=_CONTINUE)
            if refusal is not None:
                self.denied.append(refusal)
                return self._send(nid, error=errno.EACCES)
            if self._counted(call, caller):
                return
            if enforce and call.op != "exec":
                return self._carry_out(nid, call, caller)
            self._send(nid, flags=_CONTINUE)
        finally:
            caller.close()

    def _refusal(self, call, caller) -> Event | None:
        """The refused path, when ``rules`` refuse ``call`` (mode "enforce")."""
        for path, magic in zip(call.paths, call.magic):
            checked = rule_path(path, magic)
            if checked is None:              # a pipe, socket or anonymous file the process holds open...
                refused = call.op == "link"  # ...but not a new name for it
            else:
                refused = under(checked, self.rules.hidden) or (call.writes and not under(checked, self.rules.writable))
            if refused or caller.foreign_proc(path):
                return Event(_what(call), path, caller.tid)
        return None

    def _counted(self, call, caller) -> bool:
        """Count ``call`` if it is an event under ``count_under``; True when it was killed before running."""
        root = self.rules.count_under
        if root is None or not call.writes or call.magic[-1] is not None or not under(call.paths[-1], (root,)):
            return False
        event = Event(_what(call), call.paths[-1], caller.tid)
        self.events.append(event)
        if self.rules.kill_at is None or len(self.events) != self.rules.kill_at[0]:
            return False
        pid = self.rules.kill_at[1] if self.rules.kill_at[1] is not None else caller.tgid
        if self.rules.kill_after_write:
            self._doomed = (pid, event)
            return False
        self._kill(pid, event, caller)
        return True

    def _hold_socket(self, nid, tid: int, fd: int):
        """A socket about to connect or listen: keep a copy of it here (pidfd_getfd), so that it outlives the
        rank's own descriptor until the traffic witness has read it (a connection's counters; the listener a
        connection went to, which names its rank); then let the call run."""
        copy = take_fd(tid, fd)
        if copy is not None and self._valid(nid):
            self.sockets.append(copy)
        elif copy is not None:
            os.close(copy)
        self._send(nid, flags=_CONTINUE)

    def _kill(self, pid: int, event: Event, caller):
        """SIGKILL ``pid`` and the caller's process; the caller's call is left unanswered, so it never runs
        (an answer could reach the kernel before the signal does)."""
        self._doomed, self.killed = None, event
        for target in {pid, caller.tgid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGKILL)
            self._killed_pids.add(target)

    def _carry_out(self, nid, call, caller):
        """Do ``call`` here, on the checked path, as the caller (``_acting``), and answer with its result
        (mode "enforce")."""
        try:
            if call.op == "open":
                with acting_as(caller.tid):
                    fd = caller.open(call)
                try:
                    self._ioctl(_ADDFD, struct.pack(_ADDFD_ARGS, nid, _ADDFD_SEND, fd, 0, call.flags & os.O_CLOEXEC))
                finally:
                    os.close(fd)
                return
            with acting_as(caller.tid):
                caller.apply(call)
        except OSError as e:
            return self._send(nid, error=e.errno or errno.EIO)
        self._send(nid)

    # ---- the listener's ioctls ---------------------------------------------------------------------

    def _ioctl(self, request: int, payload: bytes) -> bool:
        try:
            fcntl.ioctl(self.listener_fd, request, bytearray(payload), True)
            return True
        except OSError as e:
            if e.errno == errno.ENOENT:
                return False                 # the caller died or was interrupted: nothing to answer
            raise

    def _valid(self, nid: int) -> bool:
        return self._ioctl(_ID_VALID, struct.pack("=Q", nid))

    def _send(self, nid: int, error: int = 0, flags: int = 0):
        self._ioctl(_SEND, struct.pack(_RESP, nid, 0, -error, flags))


def _what(call) -> str:
    if call.op == "open":
        return "open for writing" if call.writes else "open for reading"
    return _WHAT[call.op]
