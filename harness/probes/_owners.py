"""Whose socket is whose: each snapshot of a world's sockets, rank by rank (see ``traffic``).

``PidOwners`` reads each rank's fd table and its descendants' (the test process may: same uid), and
``UidOwners`` takes every socket whose owner uid is a rank's (each rank its own uid, under a root
judge).  Either may take a ``_netdiag.DestroyWatch`` for the last counters of what closed between two
snapshots.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

from ..world.waiting import readable
from . import _netdiag as nd

_STATES = nd.ALL_STATES & ~(1 << nd.TCP_TIME_WAIT)   # a TIME_WAIT socket belongs to no process any more
NOTICE_WAIT = 0.05   # seconds a snapshot waits for the destroy notice of a connection that has just gone


@dataclass
class Snapshot:
    """The sockets of one world's ranks at one moment."""

    tcp: dict = field(default_factory=dict)        # cookie -> (rank, Sock): TCP connections a rank holds
    listening: dict = field(default_factory=dict)  # (address, port) of each rank's listening socket -> the rank
    other: list = field(default_factory=list)      # (rank, what): sockets of a kind no traced op uses (UDP, raw)
    shared: list = field(default_factory=list)     # (inode, ranks): one socket in several ranks' fd tables
    gone: dict = field(default_factory=dict)       # cookie -> (rank, Sock): connections of the last snapshot
                                                   # no rank holds now, with their last counters where known


def _descendants(pid: int) -> list[int]:
    """The process and every process under it: a rank can fork a helper to hold its sockets."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):   # each thread's children: any thread can fork
                fd = os.open(f"/proc/{p}/task/{task}/children", os.O_RDONLY)
                try:
                    todo += map(int, os.read(fd, 1 << 16).split())
                finally:
                    os.close(fd)
        except OSError:
            continue   # it exited as we looked
    return found


def sockets_of(pid: int) -> dict[int, str]:
    """inode -> its fd's path, for each socket a process holds (``socket:[inode]`` in its fd table)."""
    found = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        path = f"/proc/{pid}/fd/{name}"
        try:
            target = os.readlink(path)
        except OSError:
            continue   # closed as we looked
        if target.startswith("socket:["):
            found[int(target[8:-1])] = path
    return found


def held_by(pid: int) -> set:
    """The inodes of every socket the process and its descendants hold."""
    return set().union(*(sockets_of(p).keys() for p in _descendants(pid)))


def _protocol(path: str) -> str:
    """A socket's protocol, as the kernel names it ("TCP", "TCPv6", "UDP", "UNIX-STREAM", "RAW", ...)."""
    try:
        return os.getxattr(path, "system.sockprotoname").rstrip(b"\0").decode()
    except OSError:
        return "gone"


_CLOSE_WAIT = 8   # the far end has closed; this end is still open


class PidOwners:
    """Rank r's sockets are those in the fd tables of rank r's process and its descendants.

    Each socket's protocol is read once; the kernel's entry of each TCP socket is kept, so a
    snapshot reads the fd tables and refreshes only the connections among them (a hash lookup each,
    in one netlink round trip).  The kernel's tables are dumped only when an fd table names a TCP
    socket it has not met (a new group, or the code's own).  UDP, raw and packet sockets are the
    code's own channels; Unix and netlink sockets are left to the sandbox.
    """

    IGNORED = ("UNIX", "NETLINK", "gone")   # (prefixes) not channels this probe judges

    def __init__(self, pids: list[int], watch: nd.DestroyWatch | None = None, kept=None):
        """``pids``: the ranks' processes, in rank order; ``kept(rank)``: sockets of that rank's that the
        test process keeps copies of (inode -> a path of our own fd), counted as the rank's."""
        self.pids, self.watch, self.kept = list(pids), watch, kept
        self.protocols: dict[int, str] = {}   # inode -> protocol
        self.known: dict[int, nd.Sock] = {}   # inode -> the kernel's entry, for TCP sockets
        self.last: dict = {}                   # cookie -> (rank, Sock) at the last snapshot
        self.kept_only: list = []              # (rank, Sock): connections held only by our copies, at the last
        self.held: dict[int, set] = {}         # rank -> the inodes its processes held, at the last

    def snapshot(self) -> Snapshot:
        """Each rank's sockets as its fd tables name them now, with the kernel's current counters."""
        held, kept_only = [], {}
        for r, pid in enumerate(self.pids):
            paths = {}
            for p in _descendants(pid):
                paths.update(sockets_of(p))
            self.held[r] = set(paths)
            if self.kept is not None:
                kept_only[r] = {i: path for i, path in self.kept(r).items() if i not in paths}
                paths.update(kept_only[r])
            for inode in paths.keys() - self.protocols.keys():
                self.protocols[inode] = _protocol(paths[inode])
            held.append((r, set(paths)))
        every = set().union(*(inodes for _, inodes in held))
        self.protocols = {i: self.protocols[i] for i in every}
        tcp = {i for i in every if self.protocols[i].startswith("TCP")}
        if tcp - self.known.keys():
            self.known = self._learn(tcp)
        entries = {i: self.known[i] for i in tcp if i in self.known}
        connected = [s for s in entries.values() if s.state != nd.TCP_LISTEN]
        for old, now in zip(connected, nd.lookup(connected)):
            if now is None:
                del entries[old.inode]   # closed (reset, or shut) with its fd still open: no counters to read
            else:
                entries[old.inode] = now
        self.kept_only = [(r, entries[i]) for r, inodes in kept_only.items() for i in inodes
                          if i in entries and entries[i].state != nd.TCP_LISTEN]
        snap = _assemble(held, entries)
        snap.other = [(r, f"a {self.protocols[i]} socket (inode {i})") for r, inodes in held for i in sorted(inodes)
                      if not self.protocols[i].startswith(("TCP",) + self.IGNORED)]
        self.last = _gone_since(self.watch, self.last, snap)
        return snap

    def handed_out(self) -> list:
        """(rank, Sock) for each connection of the last snapshot that only our copy held, and that is still
        connected after our copy was closed: another process holds it (closing the last copy sends a FIN)."""
        ends = [s for _, s in self.kept_only]
        return [(r, now) for (r, _), now in zip(self.kept_only, nd.lookup(ends))
                if now is not None and now.state in (nd.TCP_ESTABLISHED, _CLOSE_WAIT)]

    @staticmethod
    def _learn(tcp: set) -> dict:
        """The kernel's entry of each of these TCP sockets: a dump of its IPv4 table, and of its IPv6 one
        only if some are still missing (each dump walks a whole hash table: milliseconds)."""
        found = {}
        for family in (socket.AF_INET, socket.AF_INET6):
            found.update({s.inode: s for s in nd.dump(family, "tcp", _STATES) if s.inode in tcp})
            if tcp <= found.keys():
                break
        return found


class UidOwners:
    """Rank r's sockets are those the kernel says uid ``uids[r]`` created (the uid stays with a socket
    whoever holds it): a full dump of the kernel's TCP and UDP tables per snapshot."""

    def __init__(self, uids: list[int], watch: nd.DestroyWatch | None = None):
        """``uids``: each rank's own uid, in rank order."""
        self.rank_of = {uid: r for r, uid in enumerate(uids)}
        self.watch = watch
        self.last: dict = {}

    def snapshot(self) -> Snapshot:
        """Every TCP and UDP socket the ranks' uids own now, found by one dump of each kernel table."""
        held: dict[int, set] = {r: set() for r in self.rank_of.values()}
        entries = {}
        for s in nd.dump_all(_STATES):
            r = self.rank_of.get(s.uid)
            if r is not None:
                key = s.inode or -s.cookie   # a connection still in its listener's queue has no inode yet
                held[r].add(key)
                entries[key] = s
        snap = _assemble(sorted(held.items()), entries)
        self.last = _gone_since(self.watch, self.last, snap)
        return snap

    @staticmethod
    def handed_out() -> list:
        """Nothing: a socket keeps its creator's uid whoever holds it, so a snapshot never loses one."""
        return []


def _gone_since(watch: nd.DestroyWatch | None, last: dict, snap: Snapshot) -> dict:
    """Fill ``snap.gone``: the connections of the last snapshot that no rank holds now, each with its
    last counters: the kernel's, while it still has the socket (closing, or held by another process),
    else its destroy notice's.  A notice names its socket by cookie only (no uid, no inode: the socket
    has left its process), so one no snapshot saw cannot be told from another process's.  The kernel
    sends notices from a work queue: one still missing is waited for, a little.
    Returns what the next snapshot is matched against."""
    notices = {s.cookie: s for s in watch.drain(last.__contains__)} if watch is not None else {}
    vanished = [(cookie, r, s) for cookie, (r, s) in last.items() if cookie not in snap.tcp]
    for (cookie, r, _), now in zip(vanished, nd.lookup([s for _, _, s in vanished])):
        if now is not None and now.written is not None:
            snap.gone[cookie] = (r, now)
    deadline = time.monotonic() + NOTICE_WAIT
    while watch is not None and time.monotonic() < deadline:
        if all(cookie in snap.gone or cookie in notices for cookie, _, _ in vanished):
            break
        readable([watch.sock], max(0.0, deadline - time.monotonic()))
        notices.update({s.cookie: s for s in watch.drain(last.__contains__)})
    for cookie, r, _ in vanished:
        if cookie not in snap.gone and cookie in notices:
            snap.gone[cookie] = (r, notices[cookie])
    return snap.tcp


def _assemble(held, entries: dict) -> Snapshot:
    """A snapshot from each rank's socket keys and the kernel's entry for each."""
    snap = Snapshot()
    holders: dict = {}
    for r, keys in held:
        for key in keys:
            holders.setdefault(key, []).append(r)
    for key, ranks in holders.items():
        s = entries.get(key)
        if len(ranks) > 1:
            snap.shared.append((key, ranks))
        if s is None:
            continue
        if s.proto == "udp":
            snap.other.append((ranks[0], f"a UDP socket ({s.local[0]}:{s.local[1]})"))
        elif s.state == nd.TCP_LISTEN:
            snap.listening[s.local] = ranks[0]
        else:
            snap.tcp[s.cookie] = (ranks[0], s)
    return snap
