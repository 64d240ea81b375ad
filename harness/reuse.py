"""``harness.run(..., reuse=True)``: properties that check different things about one run share it.

A call identical to an earlier successful one in this process returns that call's result again (the
values as a fresh copy, the same trace) without running.  Identical means: the same function, world
size, backend and policy, the same arguments (compared pickled), and the same content of every
``Target`` file among them, so an edited file is run afresh.  Hypothesis draws the same cases for the
same strategy in every test of a session (one seed for all), so the second, third and fourth
property over one strategy reuse the first one's runs.  Failures are never kept: each test that
meets one runs the call itself.
"""
from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict

import io
import pickle
import sys

import cloudpickle

from .target import Target

_KEPT: OrderedDict = OrderedDict()
_LIMIT = 256   # calls kept; a property's examples fit, and every value is small


def call_key(fn, world_size: int, backend: str, args: tuple, kwargs: dict, policy) -> str | None:
    """A digest that names the call, or None when its arguments cannot be pickled (then it is not kept)."""
    try:
        buffer = io.BytesIO()
        _ContentPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(
            (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None), world_size, backend, args,
             sorted(kwargs.items()), policy))
        pickled = buffer.getvalue()
    except Exception:
        return None
    digest = hashlib.sha256(pickled)
    digest.update(repr(id(fn)).encode())   # two functions of one name (a redefinition) are different calls
    for target in _targets((args, kwargs)):
        digest.update(target.digest().encode())
    return digest.hexdigest()


class _ContentPickler(cloudpickle.Pickler):
    """Tensors pickled by what they hold: torch's own pickle of two equal tensors differs (storage keys),
    so every freshly drawn case would look new."""

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor) and obj.layout == torch.strided \
                and obj.device.type != "meta":
            data = obj.detach().cpu().contiguous()
            raw = data.view(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
            return _content, (type(obj).__name__, str(data.dtype), tuple(data.shape), obj.requires_grad, raw)
        return super().reducer_override(obj)


def _content(*fields):   # never called: the pickle is only digested
    return fields


def _targets(value):
    if isinstance(value, Target):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _targets(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _targets(item)


def kept_result(key: str | None):
    """(values, trace, flops) of the call named ``key``, values copied; None when it was not kept."""
    if key is None or key not in _KEPT:
        return None
    _KEPT.move_to_end(key)
    values, trace, flops = _KEPT[key]
    return copy.deepcopy(values), trace, flops


def keep_result(key: str | None, values: list, trace, flops=None):
    if key is None:
        return
    _KEPT[key] = (copy.deepcopy(values), trace, flops)
    while len(_KEPT) > _LIMIT:
        _KEPT.popitem(last=False)


def forget_kept():
    """Drop every kept call (a new session: nothing from an earlier judge may be reused)."""
    _KEPT.clear()
