"""Library stand-ins: torch's own implementation handed in where a problem asks for the learner's.

``Target(path, names, stand_ins=("torch.utils.data.DistributedSampler", ...))`` names them.  When the file
is loaded in a rank, a public name of it that *is* one of them, or a class built on one, is refused at
once, and each of them refuses a call made straight from the file (a sampler that wraps torch's), with
``ForbiddenOp`` in plain words.  Calls from anywhere else -- the tests use torch's implementations as
their oracles -- go through.  This runs inside the rank, so code determined to get round it can (by
copying torch's source, say); it stops the ten-line cheat.
"""
from __future__ import annotations

import functools
import importlib
import sys

from .errors import ForbiddenOp

_GUARDED: dict = {}   # dotted name -> the object as torch made it (guards are installed once per process)


def resolve(dotted: str):
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


def _refusal(dotted: str) -> str:
    return (f"{dotted} is torch's own implementation of what this problem asks you to write: "
            "the file under test may not use it, subclass it or hand it in under its own name")


def guard(stand_ins, path: str):
    """Install the guards (once each) and return the objects, for ``check``."""
    found = {}
    for dotted in stand_ins:
        if dotted not in _GUARDED:
            try:
                _GUARDED[dotted] = _install(dotted)
            except (ImportError, AttributeError):
                _GUARDED[dotted] = None   # this torch has no such thing
        if _GUARDED[dotted] is not None:
            found[dotted] = _GUARDED[dotted]
    _PATHS.add(path)
    return found


_PATHS: set = set()   # the files under test in this rank: calls straight from them are refused


def _install(dotted: str):
    obj = resolve(dotted)
    if isinstance(obj, type):
        original = obj.__init__

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            _refuse_if_called_from_target(dotted)
            original(self, *args, **kwargs)
        __init__.__dict__.pop("__wrapped__", None)
        obj.__init__ = __init__
        return obj
    owner_name, _, attr = dotted.rpartition(".")
    owner = resolve(owner_name)

    @functools.wraps(obj)
    def refusing(*args, **kwargs):
        _refuse_if_called_from_target(dotted)
        return obj(*args, **kwargs)
    refusing.__dict__.pop("__wrapped__", None)
    setattr(owner, attr, refusing)
    return refusing


def _refuse_if_called_from_target(dotted: str):
    if sys._getframe(2).f_code.co_filename in _PATHS:
        raise ForbiddenOp(_refusal(dotted))


def check(module, found: dict):
    """Refuse a public name of the loaded file that is a stand-in, or a class built on one."""
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        for dotted, obj in found.items():
            if value is obj or (isinstance(value, type) and isinstance(obj, type) and issubclass(value, obj)):
                raise ForbiddenOp(f"{name}: {_refusal(dotted)}")
