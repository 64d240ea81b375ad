"""One world: N live rank processes in one process group, fed calls over pipes, watched from outside.

``World`` forks its ranks from the forkserver (``boot``), sends each call (the function, each rank's
own arguments, the policy), reads each rank's op records as they stream (``records``) and its reply
(``wire.Reply``), and turns what went wrong into a plain report (``outcomes``): a rank that raised,
one that died (or passed its memory limit, which it watches while the call runs), or a hang with
each rank's blocking line and a diagnosis.  Around every call run the witnesses no rank can reach:
the kernel's TCP counters against the trace (``probes.traffic``), the ranks' file calls
(``probes.files``) and their resident memory.  A failure kills the world; ``pool`` keeps the live ones.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from ..errors import RankCrashed, TraceTampered
from ..inputs import own_inputs
from ..probes.base import CallOutcome
from ..probes.files import FileWitness
from ..probes.memory import resident_bytes
from ..probes._owners import held_by
from ..probes.traffic import witness_for
from ..record.policy import Policy
from ..trace import Trace
from .boot import CONTEXT, RankProcess
from .diagnose import crash_message
from .outcomes import Outcomes
from .records import RecordStream, build_trace, check_record
from ..sandbox import identity
from .setup import SandboxSpec, prepare_world
from .waiting import Waiting
from .wire import TOKEN_BYTES, Reply, WireError, dump_function, dumps, read_frame

_START_TIMEOUT = 60.0   # per four ranks: on a loaded 2-core machine a world's ranks start one after another
_WATCH_INTERVAL = 0.05   # how often a call in progress reads its ranks' resident memory
_GB = 2**30
_KILL_GRACE = 1.0        # seconds the other ranks get to finish after an injected kill
_FN_KEYS: dict = {}   # rank function -> small int; holding the function keeps its key unique


def _rank_results(replies: dict) -> dict:
    """probe name -> {rank: that rank's result}, from the replies' plain data."""
    results: dict = {}
    for r, reply in replies.items():
        for name, value in reply.probes.items():
            results.setdefault(name, {})[r] = value
    return results


class World(Outcomes):
    """N live rank processes in one process group, fed tasks over pipes."""

    def __init__(self, world_size: int, backend: str, shared_dir: str | None = None,
                 sandbox: SandboxSpec = SandboxSpec()):
        """``shared_dir``: a folder every rank may read and write (the sandbox grants it at start);
        ``sandbox``: what else confines the ranks (see ``setup.SandboxSpec``)."""
        self.world_size, self.backend, self.shared = world_size, backend, shared_dir
        self.dir = tempfile.mkdtemp(prefix=f"harness-n{world_size}-")
        self.setups, self.ids_note = prepare_world(self.dir, world_size, backend, shared_dir, sandbox)
        self.conns, self.procs = [], []
        self.records = [RecordStream() for _ in range(world_size)]   # each rank's ops, streamed as issued
        self.sent_fns = set()
        self.over_memory: dict[int, tuple] = {}   # rank -> (bytes used, limit) when the watchdog ended it
        self.protections: list[dict] = []         # what confined each rank, as it said before any code under test
        for r, setup in enumerate(self.setups):
            parent, child = CONTEXT.Pipe()
            p = RankProcess((setup, child, self.records[r].writer), name=f"harness-rank{r}")
            p.start()
            child.close()
            self.records[r].started()
            self.conns.append(parent)
            self.procs.append(p)
        start_limit = _START_TIMEOUT * max(1.0, world_size / 4)
        deadline = time.monotonic() + start_limit
        self.files = FileWitness(self.dir, self.setups)
        for r, c in enumerate(self.conns):
            try:
                if c.poll(max(0.0, deadline - time.monotonic())):
                    self.files.adopt(r, c.fileno())   # its first message: the file witness's listener
            except (ConnectionError, OSError):
                pass   # it died first: said below
        for r, c in enumerate(self.conns):
            try:
                ready = c.poll(max(0.0, deadline - time.monotonic())) and json.loads(c.recv_bytes()).get("ready")
            except (EOFError, OSError, ValueError, AttributeError):   # it died before saying ready: say how
                ready = None
            if not ready:
                self.procs[r].join(1.0)
                code, stderr = self.procs[r].exitcode, self.stderr_of(r)
                self.kill()
                how = "did not start within {:g} s".format(start_limit) if code is None else "failed to start"
                message = crash_message(r, code, stderr).replace(f"rank {r} ", f"rank {r} {how}: ", 1)
                raise RankCrashed(message, r, code, stderr)
            self.protections.append({**ready, "files": self.files.states.get(r, "unavailable: it sent no listener")})
        self.traffic, traffic_state = witness_for(self.pids(), backend, self.files.kept_sockets)
        for state in self.protections:
            state["traffic"] = traffic_state
        if self.traffic is not None:
            self.traffic.begin()   # after the default group's connections are made, before any code under test

    def close(self):
        for c in self.conns:
            try:
                c.send_bytes(b"stop")
            except Exception:
                pass
        deadline = time.monotonic() + 1.0
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for c in self.conns:
            c.close()
        for stream in self.records:
            stream.close()
        self.files.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.procs, self.conns = [], []

    def kill(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(2.0)
        self.close()

    def stderr_of(self, rank: int, limit: int = 4000) -> str:
        try:
            with open(self.setups[rank].stderr, errors="replace") as f:
                return f.read()[-limit:]
        except OSError:
            return ""

    def pids(self) -> list:
        return [p.pid for p in self.procs]

    def _held_now(self, rank: int) -> set:
        """The sockets rank ``rank``'s processes hold: as the traffic witness's snapshot of this call's end read
        their fd tables, else read now."""
        held = self.traffic.held(rank) if self.traffic is not None else None
        return held if held is not None else held_by(self.pids()[rank])

    def grant_shared(self):
        """The shared folder's whole tree to the ranks' group (where the ranks run as their own uids)."""
        ids = self.setups[0].ids
        if self.shared is not None and ids is not None:
            identity.prepare_tree(self.shared, ids[1])

    def watch_memory(self, limit_gb: float):
        """End any rank whose resident memory is over the limit; the call then reports it as a crash."""
        for r, p in enumerate(self.procs):
            used = resident_bytes(p.pid)
            if used > limit_gb * _GB and p.is_alive():
                self.over_memory[r] = (used, limit_gb)
                p.kill()

    def call(self, fn, args, kwargs, policy: Policy, timeout: float, memory_gb: float, probes=()) -> tuple:
        """Run ``fn`` on every rank: (each rank's value, the trace, each probe's result by name, the injected
        kill or None).  Raises what went wrong, in plain words."""
        # Pickling a function by value scans sys.modules (~4 ms); ship each one once per world.
        fn_key = _FN_KEYS.setdefault(fn, len(_FN_KEYS))
        token = os.urandom(TOKEN_BYTES)  # a reply without it was not written by the rank loop; it leads the
                                         # payload, so even a payload the rank cannot unpickle is answered
        try:
            fn_bytes = None if fn_key in self.sent_fns else dump_function(fn)
            payloads = [token + dumps((fn_key, fn_bytes, *own_inputs(args, kwargs, r, self.world_size), policy))
                        for r in range(self.world_size)]
        except Exception as e:
            error = TypeError(f"harness.run cannot send {getattr(fn, '__qualname__', fn)} and its arguments "
                              f"to the ranks: {type(e).__name__}: {e}")
            error.world_reusable = True   # nothing was sent: the world is as it was
            raise error from e
        self.sent_fns.add(fn_key)
        for stream in self.records:   # what a rank streamed before this call is no part of it
            stream.drain()
            stream.clear()
        self.files.reset()
        if self.traffic is not None:
            self.traffic.begin()
        for probe in probes:
            probe.start(self)
        for c, payload in zip(self.conns, payloads):
            c.send_bytes(payload)
        replies, pending, killed = self._collect(token, timeout, memory_gb, probes)
        for stream in self.records:
            stream.drain()
        if self.traffic is not None and (killed is not None or pending or len(replies) < self.world_size
                                         or any(rep.status != "ok" for rep in replies.values())):
            self.traffic.reset()   # a call that did not end whole: its traffic is not judged
        if killed is not None:   # the test's own fault: what the others returned, and no trace
            self.kill()
            values = [replies[r].value if r in replies and replies[r].status == "ok" else None
                      for r in range(self.world_size)]
            return values, Trace(), {}, killed
        if pending and not any(rep.status != "ok" for rep in replies.values()):
            raise self._hang(timeout, sorted(pending))
        ops, streamed = zip(*[stream.ops(r) for r, stream in enumerate(self.records)])
        errors = {r: rep for r, rep in replies.items() if rep.status != "ok"}
        retire = any(rep.retire for rep in replies.values())   # a rank asks for a fresh world
        if errors:
            raise self._failed(errors, pending, ops, retire)
        try:
            check_record(ops, streamed, replies, policy)
            trace = build_trace(ops, self.records)
            unexplained = self.traffic.end(trace) if self.traffic is not None else None
            self.files.release_sockets(self._held_now)
            unexplained = unexplained or (self.traffic.handed_out() if self.traffic is not None else None)
            if unexplained:
                raise TraceTampered(f"the kernel saw traffic between the ranks that the trace does not explain: "
                                    f"{unexplained}")
            values = [replies[r].value for r in range(self.world_size)]
            outcome = CallOutcome(values, trace, _rank_results(replies))
            results = {probe.name: probe.finish(self, outcome) for probe in probes}
        except BaseException:
            self.kill()
            raise
        if retire:
            self.close()   # ``run`` builds a fresh world for the next call
        return values, trace, results, None

    def _collect(self, token: bytes, timeout: float, memory_gb: float, probes) -> tuple:
        """Wait for every rank's reply, reading the record streams as they come and ticking the probes and
        the memory guard.  Returns (replies by rank, the ranks still pending, the injected kill or None)."""
        call = Waiting(self, time.monotonic() + timeout)
        last_tick = time.monotonic()
        try:
            while call.pending:
                wait_until = call.deadline if call.first_error_at is None else min(call.deadline,
                                                                                   call.first_error_at + 0.3)
                left = wait_until - time.monotonic()
                if left <= 0:
                    break
                ready = [key.fileobj for key, _ in call.watched.select(min(left, _WATCH_INTERVAL))]
                if time.monotonic() - last_tick >= _WATCH_INTERVAL:   # also while records stream without a pause
                    last_tick = time.monotonic()
                    self.watch_memory(memory_gb)
                    for probe in probes:
                        probe.tick(self)
                for obj in ready:
                    if obj in call.streams:
                        call.drain(obj)
                    else:
                        self._answer(call, obj, token, probes)
        finally:
            call.watched.close()
        return call.replies, set(call.pending.values()), call.killed

    def _answer(self, call: Waiting, obj, token: bytes, probes):
        """A rank's reply pipe or its process sentinel is ready: read its reply, or note its death."""
        r = call.sentinels.pop(obj) if obj in call.sentinels else call.pending.get(obj)
        if obj is not self.conns[r]:
            call.watched.unregister(obj)
        conn = self.conns[r]
        if conn not in call.pending:
            return
        try:
            data = read_frame(conn, call.deadline) if obj is conn or conn.poll() else None
        except TimeoutError:
            return   # a frame that never ended: the rank stays unfinished, as a hang
        except (EOFError, OSError):
            data = None   # the pipe closed without a reply: the rank died
        except WireError as e:
            self.kill()
            raise TraceTampered(f"rank {r} wrote to its reply pipe what the harness's rank loop did not: {e}") from None
        del call.pending[conn]
        call.watched.unregister(conn)
        if data is None:
            call.killed = self._death(r, probes)
            call.deadline = min(call.deadline, time.monotonic() + _KILL_GRACE)
            return
        call.replies[r] = self._reply(r, data, token)
        if call.replies[r].status != "ok" and call.first_error_at is None:
            call.first_error_at = time.monotonic()

    def _reply(self, rank: int, data: bytes, token: bytes) -> Reply:
        try:
            reply = Reply.decode(data)
        except WireError as e:
            self.kill()
            raise TraceTampered(f"rank {rank} sent a reply that the harness's rank loop did not write: {e}") from None
        if reply.token != token:
            self.kill()
            raise TraceTampered(f"rank {rank} sent a reply that the harness's rank loop did not write")
        if self.conns[rank].poll(0):
            self.kill()
            raise TraceTampered(f"rank {rank} sent more than one reply")
        return reply

