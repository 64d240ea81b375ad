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
from dataclasses import dataclass

from . import _gloo
from . import _netdiag as nd
from ._owners import PidOwners, Snapshot, UidOwners, sockets_of

__all__ = ["PidOwners", "UidOwners", "Snapshot", "Difference", "difference", "check", "Witness", "sockets_of",
           "SETUP_BYTES"]
SETUP_BYTES = 8   # a new gloo connection: the connecting side writes the pair's sequence number (ssize_t)


@dataclass
class Difference:
    """What the ranks' sockets did between two snapshots."""

    sent: dict       # (src, dst) -> bytes src wrote into connections whose far end dst holds
    setup: dict      # (src, dst) -> the connection set-up in ``sent`` (SETUP_BYTES per new connection)
    foreign: list    # (rank, Sock): a connection whose far end no rank of the world holds
    escaped: list    # (rank, Sock): a connection a rank held, still open, that no rank holds now
    other: list      # (rank, what)
    shared: list     # (inode, ranks)
    lost: set        # (src, dst): a connection between them closed unseen, its last bytes unknown


def difference(before: Snapshot, after: Snapshot) -> Difference:
    """Bytes each rank wrote to each other rank between the snapshots.  A connection open at both is
    differenced; a new one counts from zero (``written`` holds no SYN); one that a rank held before and
    none holds after counts up to its last counters (``Snapshot.gone``), and is ``lost`` without them.
    A connection's far end is the socket with the mirror 4-tuple, as either snapshot saw it."""
    ends = {(s.local, s.remote): r for snap in (before, after) for r, s in snap.tcp.values()}
    listening = {**before.listening, **after.listening}
    diff = Difference({}, {}, [], [], after.other, after.shared, set())

    def count(r: int, s: nd.Sock, old: nd.Sock | None, end: int | None):
        """Rank r's end s of a connection (``old``: as the first snapshot saw it) wrote its bytes since then
        (end None: unknown).  A connection whose far end no snapshot saw (made and closed within the call; the
        test process kept this end, ``files``) but that went to a rank's listener is that rank's: what the
        far end wrote is what this end received (a FIN counts one byte there)."""
        start, new = (old.written if old else 0), old is None
        peer = ends.get((s.remote, s.local))
        if peer is None and end is not None and _listener_of(listening, s.remote) is not None:
            peer = _listener_of(listening, s.remote)
            diff.sent[(peer, r)] = diff.sent.get((peer, r), 0) + max(0, _received(s) - (_received(old) if old else 0))
        if peer is None:
            if end or s.state in (nd.TCP_ESTABLISHED, nd.TCP_SYN_SENT, nd.TCP_SYN_RECV):   # carried bytes, or
                diff.foreign.append((r, s))                                                  # is (being) connected
        elif end is None:
            diff.lost.add((r, peer))
        elif peer != r:
            diff.sent[(r, peer)] = diff.sent.get((r, peer), 0) + end - start
            if new and s.remote in listening:   # this end connected: it wrote the sequence number
                diff.setup[(r, peer)] = diff.setup.get((r, peer), 0) + SETUP_BYTES

    for cookie, (r, s) in after.tcp.items():
        old = before.tcp.get(cookie)
        count(r, s, old[1] if old else None, s.written)
    for cookie, (r, s) in before.tcp.items():
        if cookie not in after.tcp:
            last = after.gone.get(cookie, (r, None))[1]
            if last is not None and last.state == nd.TCP_ESTABLISHED:   # not closed: held outside the world
                diff.escaped.append((r, last))
            count(r, last if last is not None else s, s, last.written if last is not None else None)
    return diff


_FIN_RECEIVED = (6, 7, 8, 9, 11)   # TIME_WAIT, CLOSE, CLOSE_WAIT, LAST_ACK, CLOSING: the far end has closed


def _received(s: nd.Sock) -> int:
    """The bytes the far end wrote into the connection, as this end counts them (less a FIN's one)."""
    return max(0, (s.bytes_received or 0) - (1 if s.state in _FIN_RECEIVED else 0))


def _listener_of(listening: dict, address: tuple) -> int | None:
    """The rank listening at ``address`` (on that address, or on every address of its family)."""
    host, port = address[0], address[1]
    for where in ((host, port), ("0.0.0.0", port), ("::", port)):
        if where in listening:
            return listening[where]
    return None


def check(diff: Difference, trace) -> str | None:
    """None when the kernel's view agrees with the trace, else what it saw, in one sentence: a socket
    shared by ranks, a connection out of the world, a socket of a kind no op uses, then bytes no op
    explains or ops whose bytes never crossed, pair by pair.  Every new connection between two ranks
    must start as gloo's do, with SETUP_BYTES from the side that connected."""
    problems = [f"ranks {', '.join(map(str, ranks))} hold one socket between them (inode {inode})"
                for inode, ranks in diff.shared]
    problems += [f"rank {r} holds a TCP connection to a process outside its world ({s.remote[0]}:{s.remote[1]}, "
                 f"from {s.local[0]}:{s.local[1]})" for r, s in diff.foreign]
    problems += [f"a TCP connection rank {r} held ({s.local[0]}:{s.local[1]} to {s.remote[0]}:{s.remote[1]}) is "
                 "still open, but no rank holds it now: it was handed to a process outside the world"
                 for r, s in diff.escaped]
    problems += [f"rank {r} used {what}, which no traced op does" for r, what in diff.other]
    if problems:
        return problems[0]
    bounds = _gloo.expected(trace)
    for src, dst in sorted(set(diff.sent) | set(bounds)):
        seen, setup = diff.sent.get((src, dst), 0), diff.setup.get((src, dst), 0)
        low, high = bounds.get((src, dst), (0, 0))
        if seen > high + setup:
            return (f"rank {src} sent rank {dst} {seen - high - setup} bytes that no traced op explains "
                    f"({seen} bytes crossed; the trace accounts for {high + setup})")
        if (src, dst) in diff.lost or seen >= low + setup:
            continue
        if seen >= low:
            return (f"rank {src} opened a connection to rank {dst} that did not start as a process group's "
                    f"({seen - low} set-up bytes, not {setup})")
        return (f"rank {src} sent rank {dst} only {seen} bytes, but the ops the trace gives it need "
                f"{low + setup}: a traced op did not run")
    return None


def witness_for(pids: list, backend: str, kept=None) -> tuple:
    """(a ``Witness`` of these ranks' TCP traffic, or None; its state for the protections).  ``kept``: the
    sockets the file witness holds copies of (every socket a rank connected), by rank."""
    if backend != "gloo":
        return None, "unavailable: NCCL moves its data outside TCP"
    try:
        watch = nd.DestroyWatch() if os.geteuid() == 0 else None
    except OSError:
        watch = None
    state = "kernel counters" + (", every connection kept till read" if kept else "") + \
        (", closed connections too" if watch else "")
    return Witness(PidOwners(pids, watch, kept)), state


class Witness:
    """The traffic check around each call of one world: ``begin()`` before it, ``end(trace)`` after.

    Each end is the next call's beginning, so traffic between calls (a thread left running) is
    checked with the next call; ``reset()`` after a call that failed.
    """

    def __init__(self, owners):
        """``owners``: a ``PidOwners`` or ``UidOwners`` of the world's ranks."""
        self.owners = owners
        self.last: Snapshot | None = None

    def begin(self):
        """Before a call: the first snapshot, unless the end of the last call already took it."""
        if self.last is None:
            self.last = self.owners.snapshot()

    def end(self, trace) -> str | None:
        """After a call that returned: None, or what the kernel saw that ``trace`` does not explain."""
        before, self.last = self.last, self.owners.snapshot()
        return check(difference(before, self.last), trace)

    def held(self, rank: int) -> set | None:
        """The inodes of the sockets rank ``rank``'s processes held at the last snapshot, where the owners
        read fd tables (else None)."""
        held = getattr(self.owners, "held", None)
        return None if held is None else held.get(rank)

    def handed_out(self) -> str | None:
        """After the file witness has closed its copies of the sockets no rank holds now (``release_sockets``):
        None, or the first of them still connected, which a process outside the world must hold."""
        for r, s in self.owners.handed_out():
            return (f"a TCP connection rank {r} held ({s.local[0]}:{s.local[1]} to {s.remote[0]}:{s.remote[1]}) is "
                    "still open, but no rank holds it now: it was handed to a process outside the world")
        return None

    def reset(self):
        """After a failed call: the next ``begin`` starts afresh (the world may be a new one)."""
        self.last = None
