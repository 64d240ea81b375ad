"""What gloo puts on the wire for each traced op: the messages, and the bytes each costs.

Every gloo message from rank a to rank b is a transport "unbound buffer" send (gloo/transport/tcp/
pair.cc).  The sender writes a NOTIFY_SEND_READY header and then the payload behind a
SEND_UNBOUND_BUFFER header; the receiver writes one NOTIFY_RECV_READY header back.  Each header is
the 48-byte ``Op::preamble`` (six size_t), so a message of n bytes costs ``n + 96`` bytes from a to
b and 48 bytes from b to a, whoever posts first: the count does not depend on timing.  (Measured
here: see tests/test_harness_traffic.py and ``python -m harness.probes.traffic``.)

The algorithms below are gloo's own (gloo/allreduce.cc, allgather.cc, reduce.cc, broadcast.cc,
barrier.cc, gather.cc, scatter.cc, alltoall(v).cc); each returns the messages one member sends, as
(destination group rank, payload bytes).  Which one each traced op runs was measured on torch 2.13
(see ``sends_of``): no reduce-scatter of gloo's own (an all-reduce of each input tensor instead), the
coalesced all-reduce and all-gather as one op over the tensors flattened, ``monitored_barrier`` as
4-byte messages to and from group rank 0.  Every case of tests/test_harness_traffic.py matches to the
byte, on each ordered pair of ranks.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

SEND_FRAMING = 96          # NOTIFY_SEND_READY + SEND_UNBOUND_BUFFER headers, sender to receiver
RECV_FRAMING = 48          # NOTIFY_RECV_READY, receiver to sender
MAX_SEGMENT = 1 << 20      # AllreduceOptions / ReduceOptions::kMaxSegmentSize


def _round_up(x: int, multiple: int) -> int:
    """gloo's roundUp: segment sizes are whole elements, segment counts whole multiples of the group."""
    return -(-x // multiple) * multiple


def ring_allreduce(size: int, me: int, nbytes: int, element: int) -> list:
    """Reduce-scatter then all-gather around the ring, each rank sending to the rank below it, in
    segments of at most 1 MiB (two or more per rank); an empty segment is not sent."""
    if size == 1 or nbytes == 0:
        return []
    max_segment = element * max(1, MAX_SEGMENT // element)
    segments = _round_up(max(-(-nbytes // max_segment), 2 * size), size)
    per_rank = segments // size
    segment = _round_up(-(-nbytes // segments), element)
    left = (me - 1) % size
    sends = []
    for first in (me + 1, me):   # the reduce-scatter's offsets, then the all-gather's
        for i in range(segments - per_rank):
            offset = ((first * per_rank + i) * segment) % (segments * segment)
            length = min(segment, nbytes - offset)
            if length > 0:
                sends.append((left, length))
    return sends


def ring_reduce(size: int, me: int, root: int, nbytes: int, element: int) -> list:
    """gloo::reduce: a ring reduce-scatter (segments of at most 1 MiB), then each rank's reduced chunk
    straight to the root."""
    if size == 1 or nbytes == 0:
        return []
    max_segment = element * (MAX_SEGMENT // element)
    segment = _round_up(min(-(-nbytes // (2 * size)), max_segment), element)
    segments = _round_up(max(-(-nbytes // segment), 2 * size), size)
    per_rank = segments // size
    left = (me - 1) % size
    sends = []
    for i in range(segments - 2):
        offset = (((me + 1) * per_rank + i) * segment) % (segments * segment)
        length = min(segment, nbytes - offset)
        if length > 0:
            sends.append((left, length))
    if me != root:
        length = min(per_rank * segment, nbytes - me * per_rank * segment)
        if length > 0:
            sends.append((root, length))
    return sends


def ring_allgather(size: int, me: int, nbytes: int) -> list:
    """gloo::allgather: each rank's block in two halves, passed up the ring (to the rank above),
    2 (size - 1) messages, empty halves included; nothing at all when there are no bytes."""
    if size == 1 or nbytes == 0:
        return []
    halves = (nbytes // 2, nbytes - nbytes // 2)
    return [((me + 1) % size, halves[i & 1]) for i in range(2 * (size - 1))]


def binomial_broadcast(size: int, me: int, root: int, nbytes: int) -> list:
    """gloo::broadcast: a binomial tree from the root, in ranks relative to it."""
    vrank = (me - root) % size
    sends = []
    bit = 1
    while bit < size:
        if vrank < bit and vrank + bit < size:
            sends.append(((vrank + bit + root) % size, nbytes))
        bit <<= 1
    return sends


def dissemination_barrier(size: int, me: int) -> list:
    """gloo::barrier: in round d = 1, 2, 4 ... each rank sends an empty message to the rank d above it."""
    sends, d = [], 1
    while d < size:
        sends.append(((me + d) % size, 0))
        d <<= 1
    return sends


def gather(size: int, me: int, root: int, nbytes: int) -> list:
    """gloo::gather: every other member sends its block straight to the root."""
    return [] if me == root else [(root, nbytes)]


def scatter(size: int, me: int, root: int, nbytes: int) -> list:
    """gloo::scatter: the root sends each other member its block."""
    return [] if me != root else [(peer, nbytes) for peer in range(size) if peer != root]


def alltoallv(size: int, me: int, counts: list) -> list:
    """gloo::alltoall(v): one message to every other rank, empty ones included."""
    return [((me + i) % size, counts[(me + i) % size]) for i in range(1, size)]


# ---- one traced op: the bytes its rank writes to each other rank ------------------------------------

_ELEMENT = {"bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int16": 2, "float16": 2,
            "bfloat16": 2, "uint16": 2, "int32": 4, "float32": 4, "uint32": 4, "complex32": 4, "int64": 8,
            "float64": 8, "uint64": 8, "complex64": 8, "complex128": 16}


class Signature(NamedTuple):
    """What gloo's traffic for one op depends on: the same for every member of one collective."""

    kind: str
    name: str           # the op's name without its namespace ("allreduce_", "monitored_barrier_", ...)
    size: int           # the group's size
    in_bytes: int
    out_bytes: int
    element: int        # bytes per element of its first tensor
    blocks: tuple       # bytes of each of its tensors
    splits: tuple | None


def signature(op) -> Signature:
    """An op's signature: what ``member_writes`` caches on, so a loop of like ops costs one model run."""
    element = _ELEMENT.get(op.dtypes[0].rsplit(".", 1)[-1], 1) if op.dtypes else 1
    blocks = tuple(element * math.prod(shape) for shape in op.shapes)
    splits = tuple(map(tuple, op.splits)) if op.splits is not None else None
    return Signature(op.kind, op.name.split(".")[1] if "." in op.name else op.name, len(op.group),
                     op.in_bytes, op.out_bytes, element, blocks, splits)


def sends_of(sig: Signature, member: int, root: int | None) -> list:
    """The messages group rank ``member`` sends for a collective, as (destination group rank, bytes)."""
    kind, size = sig.kind, sig.size
    if kind == "all_reduce":   # coalesced ones too: one all-reduce of the tensors flattened together
        return ring_allreduce(size, member, sig.in_bytes, sig.element)
    if kind == "reduce_scatter":
        # gloo has no reduce-scatter: an all-reduce of each input tensor (the whole input; each member's
        # block, for the list form; each tensor, coalesced), of which this rank keeps its slice
        return [m for block in sig.blocks for m in ring_allreduce(size, member, block, sig.element)]
    if kind == "all_gather":
        return ring_allgather(size, member, sig.in_bytes)
    if kind == "all_to_all":
        return alltoallv(size, member, _all_to_all_counts(sig))
    if kind == "barrier":
        if sig.name.startswith("monitored"):   # group rank 0 hears 4 bytes from each member, then answers each
            return [(0, 4)] if member else [(r, 4) for r in range(1, size)]
        return dissemination_barrier(size, member)
    if kind == "broadcast":
        return binomial_broadcast(size, member, root, sig.in_bytes)
    if kind == "reduce":
        return ring_reduce(size, member, root, sig.in_bytes, sig.element)
    if kind == "gather":
        return gather(size, member, root, sig.in_bytes)
    if kind == "scatter":
        return scatter(size, member, root, sig.out_bytes)
    raise ValueError(f"no gloo model for {sig.kind} ({sig.name})")


def _all_to_all_counts(sig: Signature) -> list:
    """Bytes this rank sends to each group rank: by the split sizes (rows), the list's tensors, or evenly."""
    if sig.splits is not None and sig.splits[1]:
        rows = sum(sig.splits[1])
        return [s * (sig.in_bytes // rows if rows else 0) for s in sig.splits[1]]
    if len(sig.blocks) == sig.size:
        return list(sig.blocks)
    return [sig.in_bytes // sig.size] * sig.size


@functools.lru_cache(maxsize=4096)
def member_writes(sig: Signature, me: int, root: int | None) -> tuple:
    """(other group rank, bytes) that group rank ``me`` writes for one collective: 96 + n for each
    message it sends, 48 for each it receives (what the other members send it, by the same algorithm)."""
    out: dict = {}
    for peer, nbytes in sends_of(sig, me, root):
        out[peer] = out.get(peer, 0) + nbytes + SEND_FRAMING
    for other in range(sig.size):
        if other != me:
            for peer, _ in sends_of(sig, other, root):
                if peer == me:
                    out[other] = out.get(other, 0) + RECV_FRAMING
    return tuple(out.items())


def roots(op) -> list:
    """The group ranks that may be this op's root: the one its record names (``root``, a global rank,
    when the tracer records it), the one its bytes reveal (a gather's root receives into a list, a
    scatter's sends from one), or else every member.  [None] for an op without a root."""
    if op.kind not in ("broadcast", "reduce", "gather", "scatter"):
        return [None]
    me = op.group.index(op.rank)
    if getattr(op, "root", None) is not None:
        return [op.group.index(op.root)]
    revealing = op.out_bytes if op.kind == "gather" else op.in_bytes
    if (op.kind == "gather" and op.in_bytes) or (op.kind == "scatter" and op.out_bytes):
        return [me] if revealing else [r for r in range(len(op.group)) if r != me]
    return list(range(len(op.group)))


def expected(trace) -> dict:
    """(src rank, dst rank) -> [least, most] bytes src writes to dst for the ops of the trace.

    Least and most differ only where a record leaves a root open: then each possible root is tried,
    op by op.  A receive from any source is given the sender whose send no other receive took.
    """
    bounds: dict = {}

    def add(src: int, dst: int, low: int, high: int):
        """One op's least and most bytes from src to dst."""
        bound = bounds.setdefault((src, dst), [0, 0])
        bound[0] += low
        bound[1] += high

    for op in _with_sources(trace):
        if op.kind in ("send", "recv"):
            framing = op.in_bytes + SEND_FRAMING if op.kind == "send" else RECV_FRAMING
            add(op.rank, op.peer, framing, framing)
            continue
        sig, me = signature(op), op.group.index(op.rank)
        options = [dict(member_writes(sig, me, root)) for root in roots(op)]
        for peer in set().union(*options):
            values = [option.get(peer, 0) for option in options]
            add(op.rank, op.group[peer], min(values), max(values))
    return bounds


def _with_sources(trace) -> list:
    """Every op of the trace, each receive from any source given the source whose send it took."""
    unmatched: dict = {}
    for op in trace.ops(kind=("send", "recv")):
        if op.kind == "send":
            unmatched[(op.rank, op.peer)] = unmatched.get((op.rank, op.peer), 0) + 1
        elif op.peer is not None:
            unmatched[(op.peer, op.rank)] = unmatched.get((op.peer, op.rank), 0) - 1
    ops = []
    for op in trace.ops():
        if op.kind == "recv" and op.peer is None:
            source = next((s for s in op.group if unmatched.get((s, op.rank), 0) > 0), None)
            if source is None:
                continue   # no traced send explains it: its 48 bytes stay unexplained
            unmatched[(source, op.rank)] -= 1
            op = dataclasses.replace(op, peer=source)
        ops.append(op)
    return ops
