"""The test process's side of the op records: each rank's stream, and the trace and checks built from it.

A rank streams each op record as it issues it (``_recorder.Recorder.flight``); ``RecordStream``
reads that pipe as the call runs, so a rank cannot take back or edit a record once its op has run.
After the call the test process builds the ``Trace`` from these streams (``build_trace``), checks
them against what each rank's own tracer says it holds and against the call's policy
(``check_record``), and asks whether the ranks' ops paired up (``ops_balanced``: if so, a failed
call left nothing in flight and its world can serve the next call).
"""
from __future__ import annotations

import dataclasses
import json
import os

from .boot import CONTEXT
from ..errors import ForbiddenOp, TraceTampered
from ..record.policy import Policy, ops_digest
from ..trace import CommOp, PhaseSpan, Trace

# all that a wait (or, at the call's end, what the in-flight work was used for) may add to a record
_WAIT_FIELDS = ("wait_start", "wait_end", "blocking", "compute_between", "compute_used")
_OP_FIELDS = {f.name for f in dataclasses.fields(CommOp)}


class RecordStream:
    """One rank's op records, streamed over a pipe as they are issued (``Recorder.flight``).

    The test process builds each call's trace from this stream, so a rank cannot take back or edit
    a record once its op has run.
    """

    def __init__(self):
        self.reader, self.writer = CONTEXT.Pipe(duplex=False)
        self.buffer = bytearray()

    def started(self):
        self.writer.close()   # the rank holds the only writer now

    def close(self):
        self.reader.close()

    def drain(self) -> bool:
        """Read what has arrived; False once the pipe is at its end (the rank is gone)."""
        try:
            while self.reader.poll(0):
                chunk = os.read(self.reader.fileno(), 1 << 20)
                if not chunk:
                    return False
                self.buffer += chunk
        except OSError:
            return False
        return True

    def clear(self):
        self.buffer.clear()

    def raw_events(self) -> list:
        events = []
        for line in bytes(self.buffer).split(b"\n"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            # the call's own (the test process cleared the stream when it began); a line without a kind of
            # event is none of the recorder's, and the checks of the record judge what is left
            if isinstance(event, dict) and isinstance(event.get("ev"), str):
                events.append(event)
        return events

    def events(self) -> list:
        """The events in the form the hang diagnosis reads: issue events carry the op's fields."""
        return [{**ev.get("op", {}), "ev": "issue", "i": ev.get("i")} if ev.get("ev") == "issue" else ev
                for ev in self.raw_events()]

    def ops(self, rank: int) -> tuple[list[dict], list[dict]]:
        """(the ops as issued, with only wait times added later; each op's last streamed form, raw)."""
        ops: dict[int, dict] = {}
        last: dict[int, dict] = {}
        for ev in self.raw_events():
            if ev.get("ev") in ("issue", "wait", "done", "used") and isinstance(ev.get("op"), dict):
                i = ev.get("i")
                if ev["ev"] == "issue":
                    ops[i] = _normalised_op(ev["op"], rank)
                elif i not in ops:
                    raise TraceTampered(f"rank {rank}'s record stream updates op {i} before issuing it")
                else:   # a wait can only add its times: what an op was is fixed when it is issued
                    ops[i].update({k: ev["op"].get(k) for k in _WAIT_FIELDS if k in ops[i] or k in ev["op"]})
                last[i] = ev["op"]
        if set(ops) != set(range(len(ops))):
            raise TraceTampered(f"rank {rank}'s record stream numbers its ops {sorted(map(str, ops))}, "
                                f"not 0..{len(ops) - 1}")
        return [ops[i] for i in range(len(ops))], [last[i] for i in range(len(ops))]

    def phases(self) -> list[dict]:
        spans = {ev.get("k"): ev.get("span") for ev in self.raw_events() if ev.get("ev") == "phase"}
        return [spans[k] for k in sorted(spans, key=lambda k: (not isinstance(k, int), str(k)))]


def _normalised_op(op: dict, rank: int) -> dict:
    """A streamed record, with JSON's lists turned back into the tuples a CommOp holds."""
    if op.get("rank") != rank or not isinstance(op.get("group"), list):
        raise TraceTampered(f"rank {rank} streamed a malformed op record {str(op)[:200]}")
    op = {k: v for k, v in op.items() if k in _OP_FIELDS}
    op["group"] = tuple(op["group"])
    op["shapes"] = [tuple(s) for s in op.get("shapes") or []]
    if op.get("splits") is not None:
        op["splits"] = tuple(tuple(s) for s in op["splits"])
    return op


def _comm_op(op: dict) -> CommOp:
    try:
        return CommOp(**op)
    except TypeError as e:
        raise TraceTampered(f"rank {op.get('rank')} streamed a malformed op record: {e}") from None


def build_trace(ops: list, streams: list) -> Trace:
    """The call's trace: each rank's ops as ``RecordStream.ops`` gave them, and its streamed phases."""
    return Trace([[_comm_op(op) for op in rank_ops] for rank_ops in ops],
                 [[PhaseSpan(**span) for span in stream.phases()] for stream in streams])


def check_record(ops: list, streamed: list, replies: dict, policy: Policy):
    """The test process's own checks of what the ranks streamed: code in a rank that clears its policy
    or edits its tracer's lists after the fact changes nothing here.  The rank's op-count check read
    its own lists, so those must match the stream too (the digest)."""
    for r, rank_ops in enumerate(ops):
        if len(rank_ops) != replies[r].ops_traced:
            raise TraceTampered(f"rank {r} streamed {len(rank_ops)} op records but its tracer holds "
                                f"{replies[r].ops_traced}: something wrote to, or edited, the harness's record")
        if ops_digest(streamed[r]) != replies[r].ops_digest:
            raise TraceTampered(f"rank {r}'s tracer holds op records that differ from what it streamed: "
                                "something edited the harness's record")
        for op in rank_ops:
            try:
                policy.check(op["kind"], op["site"])
            except ForbiddenOp as e:
                raise ForbiddenOp(f"rank {r}: {e}") from None


def ops_balanced(ops_by_rank: list) -> bool:
    """Every group's members issued as many collectives, and every send met its recv."""
    collectives, sends, recvs = {}, {}, {}
    for rank, ops in enumerate(ops_by_rank):
        for op in ops:
            if op["kind"] == "send":
                sends[(rank, op["peer"])] = sends.get((rank, op["peer"]), 0) + 1
            elif op["kind"] == "recv":
                recvs[(op["peer"], rank)] = recvs.get((op["peer"], rank), 0) + 1
            else:
                collectives.setdefault(op["group"], {}).setdefault(rank, 0)
                collectives[op["group"]][rank] += 1
    for group, counts in collectives.items():
        if len(counts) != len(group) or len(set(counts.values())) > 1:
            return False
    return sends == recvs
