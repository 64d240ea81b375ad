"""The traffic witness: the bytes that really crossed between ranks, from the kernel, against the trace.

The trace of a call is made inside the ranks, where the code under test could forge it, dodge it, or
move its data over a channel of its own while issuing decoy collectives of the right shapes.  The
kernel's per-connection TCP counters (``_netdiag``) are out of that code's reach.  Between two
snapshots, ``difference`` gives the bytes each rank wrote to each other rank, the connections whose
far end no rank of the world holds, and the UDP sockets a rank holds; ``check`` compares the bytes
with what the trace's ops put on the wire under gloo's protocol (``_gloo``), which is exact: no
timing enters it, so the only slack is what the record leaves open (a root it does not name).

Whose socket is whose: ``PidOwners`` reads each rank's fd table (and its descendants'), which the
test process may as the same uid, and keeps the kernel's entry of each socket between snapshots, so
a steady world costs one batched lookup.  ``UidOwners`` takes every socket whose owner uid is a
rank's (each rank its own uid, under a root judge): no fd scan, nothing a helper process can hide,
but a full dump of the kernel's tables per snapshot.  Either takes a ``DestroyWatch`` (root), which
gives the last counters of the sockets that closed between two snapshots.

``Witness`` is the loop's view: ``begin()`` before a call, ``end(trace)`` after it, which returns
None or a sentence saying what the kernel saw that the trace does not explain.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import _gloo
from . import _netdiag as nd

_STATES = nd.ALL_STATES & ~(1 << nd.TCP_TIME_WAIT)   # a TIME_WAIT socket belongs to no process any more
SETUP_BYTES = 8   # a new gloo connection: the connecting side writes the pair's sequence number (ssize_t)


@dataclass
class Snapshot:
    """The sockets of one world's ranks at one moment."""

    tcp: dict = field(default_factory=dict)        # cookie -> (rank, Sock): TCP connections a rank holds
    listening: set = field(default_factory=set)    # (address, port) of the ranks' listening sockets
    other: list = field(default_factory=list)      # (rank, what): sockets of a kind no traced op uses (UDP, raw)
    shared: list = field(default_factory=list)     # (inode, ranks): one socket in several ranks' fd tables
    destroyed: dict = field(default_factory=dict)  # cookie -> (rank, Sock): rank connections closed since the
                                                   # last snapshot, with their last counters (``DestroyWatch``)


@dataclass
class Difference:
    """What the ranks' sockets did between two snapshots."""

    sent: dict       # (src, dst) -> bytes src wrote into connections whose far end dst holds
    setup: dict      # (src, dst) -> the connection set-up in ``sent`` (SETUP_BYTES per new connection)
    foreign: list    # (rank, Sock): a connection whose far end no rank of the world holds
    other: list      # (rank, what)
    shared: list     # (inode, ranks)
    lost: set        # (src, dst): a connection between them closed unseen, its last bytes unknown


def _descendants(pid: int) -> list[int]:
    """The process and every process under it: a rank can fork a helper to hold its sockets."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
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


def _protocol(path: str) -> str:
    """A socket's protocol, as the kernel names it ("TCP", "TCPv6", "UDP", "UNIX-STREAM", "RAW", ...)."""
    try:
        return os.getxattr(path, "system.sockprotoname").rstrip(b"\0").decode()
    except OSError:
        return "gone"


class PidOwners:
    """Rank r's sockets are those in the fd tables of rank r's process and its descendants.

    Each socket's protocol is read once; the kernel's entry of each TCP socket is kept, so a
    snapshot reads the fd tables and refreshes only the connections among them (a hash lookup each,
    in one netlink round trip).  The kernel's tables are dumped only when an fd table names a TCP
    socket it has not met (a new group, or the code's own).  UDP, raw and packet sockets are the
    code's own channels; Unix and netlink sockets are left to the sandbox.
    """

    IGNORED = ("UNIX", "NETLINK", "gone")   # (prefixes) not channels this probe judges

    def __init__(self, pids: list[int], watch: nd.DestroyWatch | None = None):
        self.pids, self.watch = list(pids), watch
        self.protocols: dict[int, str] = {}   # inode -> protocol
        self.known: dict[int, nd.Sock] = {}   # inode -> the kernel's entry, for TCP sockets
        self.last: dict = {}                   # cookie -> (rank, Sock) at the last snapshot

    def snapshot(self) -> Snapshot:
        held = []
        for r, pid in enumerate(self.pids):
            paths = {}
            for p in _descendants(pid):
                paths.update(sockets_of(p))
            for inode in paths.keys() - self.protocols.keys():
                self.protocols[inode] = _protocol(paths[inode])
            held.append((r, set(paths)))
        every = set().union(*(inodes for _, inodes in held))
        self.protocols = {i: self.protocols[i] for i in every}
        tcp = {i for i in every if self.protocols[i].startswith("TCP")}
        if tcp - self.known.keys():
            self.known = {s.inode: s for s in nd.dump_all(_STATES, udp=False) if s.inode in tcp}
        entries = {i: self.known[i] for i in tcp if i in self.known}
        connected = [s for s in entries.values() if s.state != nd.TCP_LISTEN]
        for old, now in zip(connected, nd.lookup(connected)):
            if now is None:
                del entries[old.inode]   # closed (reset, or shut) with its fd still open: no counters to read
            else:
                entries[old.inode] = now
        snap = _assemble(held, entries)
        snap.other = [(r, f"a {self.protocols[i]} socket (inode {i})") for r, inodes in held for i in sorted(inodes)
                      if not self.protocols[i].startswith(("TCP",) + self.IGNORED)]
        self.last = _destroyed_since(self.watch, self.last, snap)
        return snap


class UidOwners:
    """Rank r's sockets are those the kernel says uid ``uids[r]`` created (the uid stays with a socket
    whoever holds it): a full dump of the kernel's TCP and UDP tables per snapshot."""

    def __init__(self, uids: list[int], watch: nd.DestroyWatch | None = None):
        self.rank_of = {uid: r for r, uid in enumerate(uids)}
        self.watch = watch
        self.last: dict = {}

    def snapshot(self) -> Snapshot:
        held: dict[int, set] = {r: set() for r in self.rank_of.values()}
        entries = {}
        for s in nd.dump_all(_STATES):
            r = self.rank_of.get(s.uid)
            if r is not None:
                key = s.inode or -s.cookie   # a connection still in its listener's queue has no inode yet
                held[r].add(key)
                entries[key] = s
        snap = _assemble(sorted(held.items()), entries)
        self.last = _destroyed_since(self.watch, self.last, snap)
        return snap


def _destroyed_since(watch: nd.DestroyWatch | None, last: dict, snap: Snapshot) -> dict:
    """Fill ``snap.destroyed`` with the last counters of the connections of the previous snapshot
    (``last``) that the kernel destroyed since.  A notice names its socket by cookie only (no uid, no
    inode: the socket has left its process), so one that no snapshot saw cannot be told from any
    other process's.  Returns what the next snapshot's notices are matched against."""
    if watch is not None:
        snap.destroyed = {s.cookie: (last[s.cookie][0], s) for s in watch.drain(last.__contains__)
                          if s.proto == "tcp"}
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
            snap.listening.add(s.local)
        else:
            snap.tcp[s.cookie] = (ranks[0], s)
    return snap


def difference(before: Snapshot, after: Snapshot) -> Difference:
    """Bytes each rank wrote to each other rank between the snapshots.  A connection open at both is
    differenced; a new one counts from zero (``written`` holds no SYN); one that closed counts up to its
    destroy notice, and is ``lost`` without one.  A connection's far end is the socket with the mirror
    4-tuple, as either snapshot saw it."""
    ends = {(s.local, s.remote): r for snap in (before, after) for r, s in snap.tcp.values()}
    ends.update({(s.local, s.remote): r for r, s in after.destroyed.values()})
    listening = before.listening | after.listening
    diff = Difference({}, {}, [], after.other, after.shared, set())

    def count(r: int, s: nd.Sock, start: int, end: int | None, new: bool):
        peer = ends.get((s.remote, s.local))
        if peer is None:
            if end or s.state in (nd.TCP_ESTABLISHED, 2, 3):   # carried bytes, or is (being) connected
                diff.foreign.append((r, s))
        elif end is None:
            diff.lost.add((r, peer))
        elif peer != r:
            diff.sent[(r, peer)] = diff.sent.get((r, peer), 0) + end - start
            if new and s.remote in listening:   # this end connected: it wrote the sequence number
                diff.setup[(r, peer)] = diff.setup.get((r, peer), 0) + SETUP_BYTES

    for cookie, (r, s) in after.tcp.items():
        old = before.tcp.get(cookie)
        count(r, s, old[1].written or 0 if old else 0, s.written, old is None)
    for cookie, (r, s) in before.tcp.items():
        if cookie not in after.tcp:
            final = after.destroyed.get(cookie)
            count(r, s, s.written or 0, final[1].written if final else None, False)
    for cookie, (r, s) in after.destroyed.items():
        if cookie not in before.tcp and cookie not in after.tcp:   # opened and closed between the two
            count(r, s, 0, s.written, True)
    return diff


def check(diff: Difference, trace) -> str | None:
    """None when the kernel's view agrees with the trace, else what it saw, in one sentence."""
    for inode, ranks in diff.shared:
        return f"ranks {', '.join(map(str, ranks))} hold one socket between them (inode {inode})"
    for r, s in diff.foreign:
        return (f"rank {r} holds a TCP connection to a process outside its world "
                f"({s.remote[0]}:{s.remote[1]}, from {s.local[0]}:{s.local[1]})")
    for r, what in diff.other:
        return f"rank {r} used {what}, which no traced op does"
    bounds = _gloo.expected(trace)
    for pair in sorted(set(diff.sent) | set(bounds)):
        seen, setup = diff.sent.get(pair, 0), diff.setup.get(pair, 0)
        low, high = bounds.get(pair, (0, 0))
        src, dst = pair
        if seen > high + setup:
            return (f"rank {src} sent rank {dst} {seen - high - setup} bytes that no traced op explains "
                    f"({seen} bytes crossed; the trace accounts for {high + setup})")
        if seen < low + setup and pair not in diff.lost:
            return (f"rank {src} sent rank {dst} only {seen} bytes, but the ops the trace gives it need "
                    f"{low + setup}: a traced op did not run")
    return None


class Witness:
    """The traffic check around each call of one world: ``begin()`` before it, ``end(trace)`` after.

    Each end is the next call's beginning, so traffic between calls (a thread left running) is
    checked with the next call; ``reset()`` after a call that failed.
    """

    def __init__(self, owners):
        self.owners = owners
        self.last: Snapshot | None = None

    def begin(self):
        if self.last is None:
            self.last = self.owners.snapshot()

    def end(self, trace) -> str | None:
        before, self.last = self.last, self.owners.snapshot()
        return check(difference(before, self.last), trace)

    def reset(self):
        self.last = None
