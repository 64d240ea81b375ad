"""Process groups, and each group's own op counter: the check that nothing bypassed the tracer.

Every gloo / NCCL group keeps a sequence counter in C++, out of Python's reach, that moves once per
backend call.  ``GroupCounters`` (a part of the rank's ``Recorder``) knows every group a call can
use, reads each counter as the call starts and again as the call ends (or as the group is
destroyed, since its counter goes with it), and compares how far it moved with how far the traced
ops say it should have moved (``ticks_of``).  A difference means an op ran out of the tracer's sight.
The helpers below turn a c10d op's group argument into a ProcessGroup and its global ranks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _torch
from ..errors import TraceTampered



class GroupCounters:
    """The group half of ``Recorder``: ``self.groups`` maps id(ProcessGroup) to {"pg", "start", "end", "ranks"}."""

    def track(self, pg) -> int | None:
        """Know of ``pg`` from now on; returns the key its ops are counted under.

        A group met for the first time during a call was created during it: its counter started at 0.
        """
        if pg is None:
            return None
        key = id(pg)
        if key not in self.groups:
            self.groups[key] = {"pg": pg, "start": 0, "end": None, "ranks": None}
        return key

    def _groups_at_start(self) -> dict:
        """Every group still alive (destroyed ones are done with), each with its counter as the call starts."""
        groups = {key: g for key, g in self.groups.items() if g["end"] is None}
        if dist.is_initialized():
            for pg in _torch.process_groups():
                groups.setdefault(id(pg), {"pg": pg, "start": 0, "end": None, "ranks": None})
        for g in groups.values():
            start = read_counter(g["pg"])
            g["start"] = 0 if start is None else start   # no backend to count with yet: nothing has run
        return groups

    def retiring(self, group):
        """``destroy_process_group(group)`` is about to run: read the counters it takes away and check them."""
        if group is None or group is dist.group.WORLD:
            pgs = [g["pg"] for g in self.groups.values()] + _torch.process_groups()
        else:
            pgs = [group]
        traced = self._traced()
        for pg in pgs:
            if not isinstance(pg, _torch.ProcessGroup):
                continue
            key = self.track(pg)
            g = self.groups[key]
            if g["end"] is not None:
                continue
            g["ranks"] = g["ranks"] or known_ranks(pg)
            g["end"] = read_counter(pg)
            problem = out_of_balance(g, g["end"], *traced.get(key, (0, None)))
            if problem and self.tampered is None:
                self.tampered = problem   # stands even if the code goes on, or catches what follows

    def check_untampered(self):
        """Compare the trace with each group's own op counter (C++, out of Python's reach): groups alive
        now, read now; groups destroyed during the call, as read when they were destroyed."""
        if self.tampered:
            raise TraceTampered(self.tampered)
        traced = self._traced()
        for key, g in self.groups.items():
            end = g["end"] if g["end"] is not None else read_counter(g["pg"])
            problem = out_of_balance(g, end, *traced.get(key, (0, None)))
            if problem:
                raise TraceTampered(problem)

    def _traced(self) -> dict:
        """group key -> (how far the traced ops should have moved its counter, the ranks they name).

        Worked out from each record's public fields, the ones the test process received: code that edits
        the recorder's lists cannot make room for an untraced op without changing what they say.
        """
        traced = {}
        for op in self.ops:
            ticks, ranks = traced.get(op["_pg"], (0, op["group"]))
            group = self.groups.get(op["_pg"])
            moved = 0 if op.get("_failed") else ticks_of(op, backend_name(group["pg"]) if group else None)
            traced[op["_pg"]] = (ticks + moved, ranks)
        return traced


def out_of_balance(g: dict, end: int | None, traced: int, traced_ranks) -> str | None:
    """What is wrong when a group's counter moved (from ``g["start"]`` to ``end``) by other than ``traced``."""
    if end is None and traced == 0:
        return None   # a group with no backend to count with has run nothing, and nothing was traced on it
    ran = "an unknown number of" if end is None else end - g["start"]
    if ran == traced:
        return None
    ranks = g["ranks"] or known_ranks(g["pg"]) or traced_ranks
    return (f"group {describe_group(g['pg'], ranks)} ran {ran} communication ops but the harness traced "
            f"{traced}: something bypassed the tracer (torch.inference_mode tensors, or a replaced c10d "
            "kernel, are not allowed)")


def process_group(pg_script_object):
    """The ProcessGroup a c10d op's argument stands for (the default group when it cannot be read)."""
    try:
        if pg_script_object is not None:
            return _torch.ProcessGroup.unbox(pg_script_object)
    except Exception:
        pass
    return dist.group.WORLD


def resolve_group(group_name):
    """The ProcessGroup a functional collective names (by name, or the group object itself)."""
    try:
        if isinstance(group_name, _torch.ProcessGroup):
            return group_name
        if isinstance(group_name, torch.ScriptObject):
            return _torch.ProcessGroup.unbox(group_name)
        return _torch.resolve_process_group(group_name)
    except Exception:
        return dist.group.WORLD


def known_ranks(pg) -> list | None:
    try:
        return dist.get_process_group_ranks(pg)
    except Exception:
        return None


def describe_group(pg, ranks) -> str:
    """``[0, 1]``; for a group torch no longer lists, what the group object still says of itself."""
    if ranks:
        return str(list(ranks))
    try:
        return f"of {pg.size()} ranks named {pg.group_name!r}"
    except Exception:
        return "of unknown ranks"


def ranks_of(pg) -> list:
    """The global ranks of a group, in group-rank order (the whole world when torch no longer knows it)."""
    return known_ranks(pg) or list(range(dist.get_world_size()))


def global_rank(group: list, local: int) -> int:
    return group[local] if 0 <= local < len(group) else local


def read_counter(pg) -> int | None:
    """The group's sequence counter: how many ops its backend has run (None: no backend to ask)."""
    try:
        return _torch.sequence_number(pg)
    except Exception:
        return None


def backend_name(pg) -> str | None:
    try:
        return pg.name()
    except Exception:
        return None


def ticks_of(op: dict, backend: str | None) -> int:
    """How far one traced op moves its group's sequence counter, from its record alone.

    Each backend call counts one.  On gloo a few ops are several backend calls (measured with torch
    2.13; tests/test_harness_tamper.py runs every public call and checks the count stays exact):
      reduce_scatter_ (the list form)       one reduce per group member: the group's size
      reduce_scatter_tensor_coalesced(_)    one reduce_scatter per tensor
      monitored_barrier_                    on group rank 0 a recv and a send per other member,
                                            on every other member one send and one recv
    """
    if backend != "gloo":
        return 1
    op_name, size = op["name"].split(".")[1], len(op["group"])   # "c10d.reduce_scatter_.default"
    if op_name == "reduce_scatter_":
        return size
    if op_name in ("reduce_scatter_tensor_coalesced_", "reduce_scatter_tensor_coalesced"):
        return len(op["shapes"])
    if op_name == "monitored_barrier_":
        return 2 * (size - 1) if op["group"][0] == op["rank"] else 2
    return 1
