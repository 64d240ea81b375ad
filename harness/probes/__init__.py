"""Measurements and faults of a call, each a probe on one seam: ``harness.run(fn, n, ..., probes=[...])``.

A probe (``base.Probe``) has up to three parts:

* ``world_key()``: what the world it runs on must be built with (a shared folder): part of the pool's key;
* ``rank_part()``: a small object that travels to every rank with the call and runs around the rank
  function (``RankPart.enter(recorder)``, ``exit() -> plain data``).  It is the only part a rank can see;
* ``start(world)`` / ``tick(world)`` / ``finish(world, call) -> result``: the test process's side, around
  the call, on each watchdog tick, and after it.

The result is plain data, in ``RunResult.probes[probe.name]``.  ``harness.defaults(probes=[...])`` gives
every call of a block the same probes, so no call of the block can be told from another by what its
ranks receive.

Rank-side, so a rank can see that they are there: ``Compute`` (compute ops between an op's issue and its
wait), ``Flops``, ``Perturb`` (one send carries a changed copy).  Test-side only: ``KillAt`` (a rank killed
at its n-th file event, counted outside the rank where the kernel allows), ``SharedFolder``.  The
witnesses every call runs, which no rank can reach, are in the world itself: resident memory, and
(``traffic``, ``files``) what the kernel saw cross the wire and the filesystem.
"""
from .base import CallOutcome, Probe, RankPart
from .compute import Compute
from .flops import Flops
from .kill import KillAt, Killed
from .memory import ResidentMemory
from .perturb import Perturb
from .shared import SharedFolder

__all__ = ["CallOutcome", "Compute", "Flops", "KillAt", "Killed", "Perturb", "Probe", "RankPart",
           "ResidentMemory", "SharedFolder"]
