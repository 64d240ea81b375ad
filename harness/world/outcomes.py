"""How a world's call went wrong, in plain words: a rank that raised, one that died (or was killed on purpose,
or passed its memory limit), or a hang with each rank's blocking line and a diagnosis (``diagnose``).

``Outcomes`` is the part of ``World`` that turns what it saw into the exception ``harness.run`` raises.
"""
from __future__ import annotations

import time

from ..errors import HangError, RankCrashed, TraceTampered
from ..probes.kill import Killed
from .diagnose import (blocking_line, crash_message, diagnose_hang, dump_stacks, hang_message, is_gloo_fallout,
                       rank_error)
from .records import ops_balanced

_GB = 2**30


class Outcomes:
    def _failed(self, errors: dict, pending: set, ops, retire: bool) -> BaseException:
        """The exception for ranks that raised; the world stays only when nothing is left in flight."""
        dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
        if dead and all(is_gloo_fallout(rep) for rep in errors.values()):
            return self._crash(dead[0])  # the others' errors are only its echo
        error = rank_error(errors, self.world_size)
        # Every rank returned and their ops pair up: nothing is left in flight, so the world is
        # reusable (a stub fails every example; rebuilding each time is slow).
        error.world_reusable = (not pending and not isinstance(error, TraceTampered) and not retire
                                and ops_balanced(ops))
        if not error.world_reusable:
            self.kill()
        return error

    def _death(self, rank: int, probes) -> Killed:
        """Rank ``rank`` died without a reply: the test's injected kill (or its fallout on another rank)
        is returned; anything else is raised as a crash."""
        for probe in probes:
            recognise = getattr(probe, "recognise", None)
            if recognise is not None:
                for r in range(self.world_size):
                    killed = recognise(self, r)
                    if killed is not None:
                        return killed
        raise self._crash(rank)

    def _crash(self, rank: int) -> RankCrashed:
        self.procs[rank].join(1.0)  # its pipe can close a moment before it is reaped
        time.sleep(0.1)  # let the other ranks' stderr settle
        code = self.procs[rank].exitcode
        stderr = self.stderr_of(rank)
        self.kill()
        if rank in self.over_memory:
            used, limit = self.over_memory[rank]
            return RankCrashed(f"rank {rank} used {used / _GB:.2f} GB (limit {limit:g} GB): the harness ended it. "
                               "Something allocates without bound (a growing list of tensors, a loop that "
                               "never ends, a shape off by a large factor?)", rank, code, stderr)
        return RankCrashed(crash_message(rank, code, stderr), rank, code, stderr)

    def _hang(self, timeout: float, stuck: list) -> HangError:
        stacks = dump_stacks(self.procs, [s.stack for s in self.setups])
        for stream in self.records:
            stream.drain()
        flights = [stream.events() for stream in self.records]
        self.kill()
        where = {r: blocking_line(stacks[r]) for r in range(self.world_size)}
        diagnosis = diagnose_hang(flights, stuck, where)
        return HangError(hang_message(timeout, stuck, where, flights, diagnosis),
                         where, diagnosis, timeout)
