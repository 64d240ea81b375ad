"""The kernel's own view of a machine's sockets: the sock_diag netlink interface (what ``ss`` reads).

Code inside a rank controls everything in its own process, so what it says it sent proves nothing.
The kernel's per-connection byte counters (``struct tcp_info``) are out of its reach: this module
dumps them for every TCP socket, IPv4 and IPv6, in one netlink request per family, and lists UDP
sockets (a datagram socket held by a rank is a channel no trace explains).  ``DestroyWatch``
subscribes to the kernel's destroy notifications, which carry the final counters of sockets that
close between two dumps (root only: the groups need CAP_NET_ADMIN).

Standard library only.  The offsets below are the kernel's uapi structs (``linux/inet_diag.h``,
``linux/tcp.h``), checked against ``ss -tin`` on kernel 6.18 (see tests/test_harness_traffic.py).
"""
from __future__ import annotations

import errno
import os
import socket
import struct
from typing import NamedTuple

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2                     # the attribute that carries struct tcp_info
INET_DIAG_PROTOCOL = 10                # the attribute that names a destroy notice's protocol
SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 270, 1
# sock_diag multicast groups: the final state of each socket as the kernel destroys it
SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET_UDP_DESTROY = 1, 2
SKNLGRP_INET6_TCP_DESTROY, SKNLGRP_INET6_UDP_DESTROY = 3, 4

TCP_ESTABLISHED, TCP_SYN_SENT, TCP_SYN_RECV, TCP_TIME_WAIT, TCP_LISTEN = 1, 2, 3, 6, 10
ALL_STATES = 0xFFF                     # bit s: TCP state s (1..11); UDP sockets are "established" or "close"

_NLMSG = struct.Struct("=IHHII")       # len, type, flags, seq, pid
_REQ = struct.Struct("=BBBxI")         # inet_diag_req_v2: family, protocol, ext mask, states; then a sockid
_MSG_HEAD = struct.Struct("=BBBB")     # inet_diag_msg: family, state, timer, retrans
_PORTS = struct.Struct(">HH")          # at 4: source and destination port, network order
_MSG_OWNER = struct.Struct("=II")      # at 64: uid, inode
_MSG_COOKIE = struct.Struct("=Q")      # at 44: the socket's cookie, unique while the machine is up
_MSG_LEN = 72
_ATTR = struct.Struct("=HH")
# struct tcp_info: the counters this module reads, and the smallest tcp_info that holds them
_TCPI_ACKED_RECEIVED = struct.Struct("=QQ")    # at 120: tcpi_bytes_acked, tcpi_bytes_received
_TCPI_NOTSENT = struct.Struct("=I")            # at 144: tcpi_notsent_bytes (written, not yet sent)
_TCPI_SENT_RETRANS = struct.Struct("=QQ")      # at 200: tcpi_bytes_sent, tcpi_bytes_retrans
_TCPI_LEN = 216


class Sock(NamedTuple):
    """One socket as the kernel reports it.  Counters are None where the kernel gave no tcp_info
    (a TIME_WAIT or a UDP socket)."""

    proto: str            # "tcp" or "udp"
    family: int           # socket.AF_INET or AF_INET6
    state: int            # TCP_ESTABLISHED, TCP_LISTEN, ...
    local: tuple          # (address text, port)
    remote: tuple
    uid: int
    inode: int            # 0 once no process holds it (TIME_WAIT, orphaned, destroyed)
    cookie: int
    sockid: bytes         # the kernel's inet_diag_sockid: what ``lookup`` asks for this socket by
    bytes_acked: int | None = None      # tcp_info: sent bytes the peer acknowledged (+1 for the SYN)
    bytes_received: int | None = None   # bytes that arrived from the peer
    bytes_sent: int | None = None       # bytes put on the wire, retransmissions included
    bytes_retrans: int | None = None
    notsent: int | None = None          # bytes the process wrote that the kernel has not sent yet

    @property
    def written(self) -> int | None:
        """Every byte the process handed to this connection: sent once, or still waiting to be sent.
        (The acked count lags behind by a delayed ack; the peer's received count, by what is in flight.)"""
        if self.bytes_sent is None:
            return None
        return self.bytes_sent - self.bytes_retrans + self.notsent


_V4_MAPPED = bytes(10) + b"\xff\xff"


def _address(family: int, raw: bytes) -> str:
    """An address as text; an IPv4 address an IPv6 socket uses (::ffff:a.b.c.d) as the IPv4 one, so the
    two ends of a connection name each other alike."""
    if family == socket.AF_INET or raw[:12] == _V4_MAPPED:
        return socket.inet_ntop(socket.AF_INET, raw[:4] if family == socket.AF_INET else raw[12:16])
    return socket.inet_ntop(family, raw[:16])


def _parse(body: bytes, proto: str) -> Sock:
    """One inet_diag_msg and its attributes."""
    family, state, _, _ = _MSG_HEAD.unpack_from(body, 0)
    sport, dport = _PORTS.unpack_from(body, 4)
    uid, inode = _MSG_OWNER.unpack_from(body, 64)
    cookie, = _MSG_COOKIE.unpack_from(body, 44)
    counters = ()
    at = _MSG_LEN
    while at + _ATTR.size <= len(body):
        length, kind = _ATTR.unpack_from(body, at)
        if length < _ATTR.size:
            break
        if kind == INET_DIAG_INFO and proto == "tcp" and length - _ATTR.size >= _TCPI_LEN:
            info = at + _ATTR.size
            acked, received = _TCPI_ACKED_RECEIVED.unpack_from(body, info + 120)
            sent, retrans = _TCPI_SENT_RETRANS.unpack_from(body, info + 200)
            notsent, = _TCPI_NOTSENT.unpack_from(body, info + 144)
            counters = (acked, received, sent, retrans, notsent)
        at += (length + 3) & ~3
    return Sock(proto, family, state, (_address(family, body[8:24]), sport), (_address(family, body[24:40]), dport),
                uid, inode, cookie, body[4:52], *counters)


def _messages(data: bytes):
    """(type, body) of each netlink message in one datagram."""
    at = 0
    while at + _NLMSG.size <= len(data):
        length, kind, _, _, _ = _NLMSG.unpack_from(data, at)
        if length < _NLMSG.size:
            return
        yield kind, data[at + _NLMSG.size:at + length]
        at += (length + 3) & ~3


def _request(family: int, proto: str, states: int, sockid: bytes, flags: int, seq: int) -> bytes:
    """One SOCK_DIAG_BY_FAMILY request: a dump (``NLM_F_DUMP``) or one socket, named by its sockid."""
    number = socket.IPPROTO_TCP if proto == "tcp" else socket.IPPROTO_UDP
    body = _REQ.pack(family, number, 1 << (INET_DIAG_INFO - 1) if proto == "tcp" else 0, states) + sockid
    return _NLMSG.pack(_NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | flags, seq, 0) + body


def _error(body: bytes) -> int:
    """The errno of an NLMSG_ERROR answer (the kernel sends it negated)."""
    code, = struct.unpack_from("=i", body, 0)
    return -code


def dump(family: int = socket.AF_INET, proto: str = "tcp", states: int = ALL_STATES) -> list[Sock]:
    """Every socket of one family and protocol in the given states (a bit mask, bit s for state s),
    with tcp_info for TCP.  The kernel walks its whole connection hash table for it (about 2.5 ms per
    family here, for 262144 buckets), however few sockets there are: ``lookup`` is the cheap refresh."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.send(_request(family, proto, states, bytes(48), NLM_F_DUMP, 1))
        found = []
        while True:
            for kind, body in _messages(nl.recv(1 << 17)):
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    raise OSError(_error(body), f"sock_diag dump refused: {os.strerror(_error(body))}")
                found.append(_parse(body, proto))


_BATCH = 64   # lookups per datagram: their answers must fit the netlink socket's receive buffer


def lookup(socks: list[Sock]) -> list[Sock | None]:
    """Each socket's current state and counters (None: it is gone, or its cookie now names another).

    The kernel finds each one by hash, so this costs a few microseconds a socket; the requests go out
    ``_BATCH`` to a datagram and the answers come back in order of their sequence numbers."""
    return [found for at in range(0, len(socks), _BATCH) for found in _lookup(socks[at:at + _BATCH])]


def _lookup(socks: list[Sock]) -> list[Sock | None]:
    if not socks:
        return []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.send(b"".join(_request(s.family, s.proto, ALL_STATES, s.sockid, 0, i + 1) for i, s in enumerate(socks)))
        found: list[Sock | None] = [None] * len(socks)
        answered = 0
        while answered < len(socks):
            data = nl.recv(1 << 17)
            at = 0
            while at + _NLMSG.size <= len(data):
                length, kind, _, seq, _ = _NLMSG.unpack_from(data, at)
                if kind == SOCK_DIAG_BY_FAMILY and 0 < seq <= len(socks):
                    found[seq - 1] = _parse(data[at + _NLMSG.size:at + length], socks[seq - 1].proto)
                answered += kind in (SOCK_DIAG_BY_FAMILY, NLMSG_ERROR)
                at += (max(length, _NLMSG.size) + 3) & ~3
        return found


def dump_all(states: int = ALL_STATES) -> list[Sock]:
    """Every TCP and UDP socket of both IP families."""
    return [s for proto in ("tcp", "udp") for family in (socket.AF_INET, socket.AF_INET6)
            for s in dump(family, proto, states)]


class DestroyWatch:
    """The kernel's notice of every TCP and UDP socket it destroys, with its last counters.

    A dump cannot see a connection that closed since the last one (a group destroyed mid-call, a side
    channel closed after use): these notices give its last counters.  They need CAP_NET_ADMIN
    (``PermissionError`` otherwise), cover every process in the network namespace, carry the 4-tuple
    and the cookie but no uid and no inode (measured on 6.18: the socket has left its process by
    then), and queue in this socket's buffer until ``drain`` reads them.  A full buffer drops notices:
    ``drain`` then sets ``lost``.
    """

    GROUPS = (SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET6_TCP_DESTROY, SKNLGRP_INET_UDP_DESTROY, SKNLGRP_INET6_UDP_DESTROY)

    def __init__(self, buffer_bytes: int = 8 << 20):
        """Subscribe; the buffer holds the notices of a busy machine between two drains (~300 bytes each)."""
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK, NETLINK_SOCK_DIAG)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, buffer_bytes)   # SO_RCVBUFFORCE: past rmem_max (root)
            self.sock.bind((0, 0))
            for group in self.GROUPS:
                self.sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
        except BaseException:
            self.sock.close()
            raise
        self.lost = False

    def drain(self, wanted=lambda cookie: True) -> list[Sock]:
        """Every socket destroyed since the last drain whose cookie is ``wanted`` (most notices are other
        processes': this keeps parsing them cheap)."""
        found = []
        while True:
            try:
                data = self.sock.recv(1 << 17)
            except BlockingIOError:
                return found
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                self.lost = True   # the kernel dropped notices while the buffer was full
                continue
            for _, body in _messages(data):
                if len(body) >= _MSG_LEN and wanted(_MSG_COOKIE.unpack_from(body, 44)[0]):
                    found.append(_parse(body, _protocol(body)))

    def close(self):
        """Unsubscribe: the kernel stops queueing notices for this socket."""
        self.sock.close()


def _protocol(body: bytes) -> str:
    """A destroy notice names its protocol in its INET_DIAG_PROTOCOL attribute (one byte)."""
    at = _MSG_LEN
    while at + _ATTR.size <= len(body):
        length, kind = _ATTR.unpack_from(body, at)
        if length < _ATTR.size:
            break
        if kind == INET_DIAG_PROTOCOL:
            return "tcp" if body[at + _ATTR.size] == socket.IPPROTO_TCP else "udp"
        at += (length + 3) & ~3
    return "tcp"
