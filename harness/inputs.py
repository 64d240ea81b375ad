"""Arguments that differ by rank: ``per_rank(values)``, and each rank's own view of a call's arguments.

A ``PerRank`` argument reaches rank r as ``values[r]`` alone: ``own_inputs`` builds each rank's
arguments before they are pickled, so no rank's payload carries another rank's values (nor, for a
view, the rest of its storage).
"""
from __future__ import annotations

import sys

from .target import Target


class PerRank:
    """An argument that differs by rank: rank r receives ``values[r]`` and never sees the others.

    ``harness.run(fn, 4, target, harness.per_rank(shards))`` calls ``fn(target, shards[r])`` on rank r,
    so one rank's code cannot read another rank's inputs (or derive the answer from them).
    """

    def __init__(self, values):
        self.values = list(values)

    def __repr__(self):
        return f"per_rank({self.values!r})"


def per_rank(values) -> PerRank:
    return PerRank(values)


def own_inputs(args, kwargs, rank: int, world_size: int):
    """This rank's view of a call's arguments: each ``PerRank`` replaced by its own entry, and each
    ``Target`` carrying its file's text (a rank reads no file of the test process's)."""
    def own(value):
        if not isinstance(value, PerRank):
            return _with_sources(value)
        if len(value.values) != world_size:
            raise ValueError(f"per_rank(...) holds {len(value.values)} values for a world of {world_size} ranks")
        return _with_sources(_without_shared_storage(value.values[rank]))
    return tuple(own(a) for a in args), {k: own(v) for k, v in kwargs.items()}


def _with_sources(value):
    if isinstance(value, Target):
        return value.with_source()
    if type(value) in (list, tuple):
        return type(value)(_with_sources(v) for v in value)
    if type(value) is dict:
        return {k: _with_sources(v) for k, v in value.items()}
    return value


def _without_shared_storage(value):
    """A view pickles its whole storage: a rank handed ``x.chunk(4)[r]`` would receive every chunk.
    Views that do not span their storage travel as copies of just their elements."""
    if isinstance(value, (list, tuple)):
        items = [_without_shared_storage(v) for v in value]
        return type(value)(items) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: _without_shared_storage(v) for k, v in value.items()}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.layout == torch.strided:
        if value.untyped_storage().nbytes() > value.numel() * value.element_size():
            return value.detach().clone().requires_grad_(value.requires_grad) if value.is_leaf else value.clone()
    return value
