"""One call's wait for its ranks (``World._collect``): what is pending, what came back, and its epoll set; and
``readable``, the engine's one wait for a few descriptors."""
from __future__ import annotations

import math
import select
import selectors


def readable(objs, timeout: float | None) -> list:
    """Those of ``objs`` (descriptors, or objects with ``fileno()``) ready to read, or at end of file, within
    ``timeout`` seconds (None: no limit).  select.select's answer without its FD_SETSIZE: a test process that
    has run many worlds holds descriptors past 1024, which select.select refuses."""
    poll, by_fd = select.poll(), {}
    for obj in objs:
        by_fd[obj if isinstance(obj, int) else obj.fileno()] = obj
    for fd in by_fd:
        poll.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poll.poll(None if timeout is None else max(0, math.ceil(timeout * 1000)))]


class Waiting:
    """One call's wait for its ranks: what is still pending, what came back, and the one epoll set that watches
    every reply pipe, process sentinel and record stream for the whole call (a poll set rebuilt at each
    wake-up, most of them for one record line, was most of the loop's cost)."""

    def __init__(self, world, deadline: float):
        self.deadline = deadline
        self.first_error_at = self.killed = None
        self.replies: dict = {}   # rank -> its wire.Reply
        self.pending = {c: r for r, c in enumerate(world.conns)}
        self.sentinels = {p.sentinel: r for r, p in enumerate(world.procs)}
        self.streams = {stream.reader: stream for stream in world.records}
        self.watched = selectors.DefaultSelector()
        for obj in (*self.pending, *self.sentinels, *self.streams):
            self.watched.register(obj, selectors.EVENT_READ)

    def drain(self, reader):
        if not self.streams[reader].drain():
            self.watched.unregister(reader)
            del self.streams[reader]   # the rank is gone: its pipe is at end of file, always ready
