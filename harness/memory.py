"""The tensor memory a rank holds, measured wherever the code keeps it (call these inside a rank).

    live_storages(exclude=(), collect=True, larger_than=0, accept=0)
                                              every tensor storage alive in this process, as ``Storages``
    live_tensor_bytes(exclude=())             their total bytes
    saved_for_backward()                      a context manager recording what autograd saves for backward

Nothing here asks the code under test where its state lives.  ``live_storages``
walks every object Python's garbage collector tracks: tensors and Parameters in
attributes, lists, optimizer state dicts, module-level dicts, closures, default
arguments, bare ``UntypedStorage`` objects, and the ``.grad`` of every tensor found
(a gradient autograd created has no Python object until someone reads it).  Each
storage is counted once, at its full size, however many tensors view it: a "shard"
that is a view into a full-size buffer costs the full buffer.

What gc cannot see are tensors held only by C++: above all the tensors autograd
saves for backward.  ``saved_for_backward()`` records those as a block saves them,
so a test can ask, after a forward, which of their storages are still alive and
how big they are (a storage freed with ``untyped_storage().resize_(0)`` counts 0).

Typical use, in a rank function::

    before = live_storages(collect=False)           # what exists already (held, so no address is reused)
    ... the code under test ...
    held = live_storages(exclude=[before, model.parameters(), batches])
    held.nbytes, held.describe()

The functions bind the C-level accessors they use when this module is imported,
so patching ``torch.Tensor`` or ``torch.UntypedStorage`` methods later does not
change a measurement.
"""
from __future__ import annotations

import gc
import time
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import compress

import torch
from torch.autograd.graph import saved_tensors_hooks

from . import _torch
from .record.recorder import active as _active_recorder

# Bound once, at import: later patches of gc, weakref, torch.Tensor or torch.UntypedStorage change nothing here.
_get_objects, _collect, _freeze_count, _unfreeze = gc.get_objects, gc.collect, gc.get_freeze_count, gc.unfreeze
_weak_ref, _sleep = weakref.ref, time.sleep
_Tensor, _UntypedStorage = torch.Tensor, torch.UntypedStorage
_tensor_storage, _tensor_grad, _tensor_detach = _torch.tensor_storage, _torch.tensor_grad, _torch.tensor_detach
_storage_nbytes, _storage_data_ptr, _storage_device = (_torch.storage_nbytes, _torch.storage_data_ptr,
                                                       _torch.storage_device)
_no_torch_function = _torch.DisableTorchFunctionSubclass


@dataclass(frozen=True)
class Held:
    """One live storage: the storage itself (held, so its address stays taken), its size, one tensor's view of it."""

    storage: object
    nbytes: int
    dtype: str = "storage"
    shape: tuple = ()
    tensor_bytes: int = 0   # the bytes that tensor itself spans

    def describe(self) -> str:
        if self.dtype == "storage":
            return f"{self.nbytes} B (a bare UntypedStorage)"
        seen = f"{self.dtype} {list(self.shape)}"
        if self.tensor_bytes < self.nbytes:   # the storage is larger than any tensor still looking at it
            return f"{self.nbytes} B (under a {seen} view of {self.tensor_bytes} B)"
        return f"{self.nbytes} B ({seen})"


class Storages(dict):
    """Live storages by (device, address), each a ``Held``; ``nbytes`` is their total."""

    @property
    def nbytes(self) -> int:
        return sum(h.nbytes for h in self.values())

    def without(self, exclude) -> "Storages":
        skip = _keys_of(exclude)
        return Storages((k, h) for k, h in self.items() if k not in skip)

    def __or__(self, other) -> "Storages":
        merged = Storages(self)
        for key, held in other.items():
            merged.setdefault(key, held)
        return merged

    def larger_than(self, nbytes: int) -> "Storages":
        return Storages((k, h) for k, h in self.items() if h.nbytes > nbytes)

    def describe(self, limit: int = 6) -> str:
        """The largest storages first, in words: '848 B (torch.float32 [212]), 16 B (...)'."""
        held = sorted(self.values(), key=lambda h: -h.nbytes)
        words = ", ".join(h.describe() for h in held[:limit])
        return words + (f" and {len(held) - limit} more" if len(held) > limit else "") if held else "nothing"


def _key(storage):
    """(device, address), or None for a storage object whose memory is gone (torch then calls it an
    "invalid python storage" and refuses its data pointer)."""
    try:
        return str(_storage_device(storage)), _storage_data_ptr(storage)
    except RuntimeError:
        return None


def _storage_of(tensor):
    """The tensor's storage, or None for tensors without one (wrapper subclasses, sparse, meta)."""
    try:
        storage = _tensor_storage(tensor)
    except Exception:   # noqa: BLE001 -- a tensor kind with no plain storage holds none of its own
        return None
    return None if _storage_device(storage).type == "meta" else storage


def _keys_of(exclude) -> set:
    """Storage keys of everything in ``exclude``: tensors, storages, Storages, and lists/tuples/sets/dicts of them."""
    keys, todo = set(), [exclude]
    with _no_torch_function():
        while todo:
            item = todo.pop()
            if isinstance(item, Storages):   # at each storage's current address: a resize_ moves it
                keys.update(_key(held.storage) for held in item.values())
            elif isinstance(item, _Tensor):
                storage = _storage_of(item)
                if storage is not None:
                    keys.add(_key(storage))
            elif isinstance(item, _UntypedStorage):
                keys.add(_key(item))
            elif isinstance(item, dict):
                todo.extend(item.values())
            elif isinstance(item, (list, tuple, set, frozenset)) or _is_iterator(item):
                todo.extend(item)
    return keys


def _is_iterator(item) -> bool:
    return hasattr(item, "__next__") and hasattr(item, "__iter__")   # e.g. module.parameters()


def _add(found: Storages, skip: set, storage, tensor=None):
    if storage is None:
        return
    key = _key(storage)
    if key is None or key in skip:
        return
    nbytes = _storage_nbytes(storage)
    if nbytes == 0:
        return
    held = found.get(key)
    if tensor is not None and (held is None or held.dtype == "storage" or tensor.numel() > _numel(held)):
        found[key] = Held(storage, nbytes, str(tensor.dtype), tuple(tensor.shape),
                          tensor.numel() * tensor.element_size())
    elif held is None:
        found[key] = Held(storage, nbytes)


def _numel(held: Held) -> int:
    n = 1
    for side in held.shape:
        n *= side
    return n


def _drop_waited_works():
    """The tracer keeps each call's Work objects to time their waits, and a Work keeps its tensors alive:
    once a wait is recorded, let it go, so buffers the code under test released are not counted as held."""
    recorder = _active_recorder()
    if recorder is not None:
        recorder.drop_waited()


def _kinds(*roots) -> frozenset:
    """The classes whose instances hold storage: the roots and every subclass defined so far."""
    found, todo = set(roots), list(roots)
    while todo:
        for cls in type.__subclasses__(todo.pop()):
            if cls not in found:
                found.add(cls)
                todo.append(cls)
    return frozenset(found)


def _scan(skip: set) -> Storages:
    found = Storages()
    objects = _get_objects()
    kinds = _kinds(_Tensor, _UntypedStorage)
    # the type test runs in C (compress/map), not in a Python loop: gc tracks some 300,000 objects once torch is in
    with _no_torch_function(), warnings.catch_warnings():
        warnings.simplefilter("ignore")   # reading .grad of a non-leaf warns
        for obj in compress(objects, map(kinds.__contains__, map(type, objects))):
            if not isinstance(obj, _Tensor):
                _add(found, skip, obj if _storage_device(obj).type != "meta" else None)
                continue
            _add(found, skip, _storage_of(obj), obj)
            try:
                grad = _tensor_grad(obj)
            except Exception:   # noqa: BLE001 -- a subclass without a readable .grad holds none
                grad = None
            if grad is not None:
                _add(found, skip, _storage_of(grad), grad)
    return found


# Pauses before each further look when too much is found: the first look again after a full collection;
# the later ones give communication threads time to let go of a finished op's buffers (gloo's worker
# still holds a Work for a moment after the waiting thread has returned from wait()).
_SETTLE = (0.0, 0.02, 0.1, 0.5)


def live_storages(exclude=(), collect: bool = True, larger_than: int = 0, accept: int = 0) -> Storages:
    """Every tensor storage alive in this process (through gc), less those of ``exclude``.

    Storages of ``larger_than`` bytes or fewer are left out (0-byte ones always are).  ``collect``
    first frees unreachable reference cycles, so garbage does not count: a cheap collection of the
    young generations, then, only when more than ``accept`` bytes remain, a full one (about 0.2 s
    with torch loaded) and further looks a moment apart (see ``_SETTLE``); these can only lower
    the count, so a caller who would accept up to ``accept`` bytes loses nothing.  A baseline taken only to be excluded
    later can skip collecting.  Objects frozen with ``gc.freeze()`` are invisible to
    gc.get_objects(), so they are unfrozen first.
    """
    if _freeze_count():
        _unfreeze()
    _drop_waited_works()
    skip = _keys_of(exclude)
    if collect:
        _collect(1)
    found = _scan(skip).larger_than(larger_than)
    for pause in _SETTLE if collect else ():
        if found.nbytes <= accept:
            break
        found = None   # our own references must not keep anything alive while we wait
        _sleep(pause)
        _collect()
        found = _scan(skip).larger_than(larger_than)
    return found


def live_tensor_bytes(exclude=(), collect: bool = True, larger_than: int = 0) -> int:
    """Bytes of every tensor storage alive in this process, each storage once, less those of ``exclude``."""
    return live_storages(exclude, collect, larger_than).nbytes


class SavedForBackward:
    """What autograd saved inside a ``saved_for_backward()`` block; ask ``storages()`` while the graph is alive."""

    def __init__(self):
        self._saved = []

    def _pack(self, tensor):
        # A new alias of the same storage: what autograd keeps is this object, so the weak reference dies
        # exactly when autograd lets go (after backward, or with the graph).  Returning the tensor itself
        # would tie an op's output to its own grad_fn in a cycle gc cannot break.
        alias = _tensor_detach(tensor)
        self._saved.append(_weak_ref(alias))
        return alias

    @staticmethod
    def _unpack(alias):
        return alias

    @property
    def count(self) -> int:
        """How many tensors autograd saved in the block."""
        return len(self._saved)

    def storages(self, exclude=()) -> Storages:
        """The storages of saved tensors autograd still holds, at their current size, less those of ``exclude``."""
        skip, found = _keys_of(exclude), Storages()
        with _no_torch_function():
            for ref in self._saved:
                alias = ref()
                if alias is not None:
                    _add(found, skip, _storage_of(alias), alias)
        return found

    def alive_bytes(self, exclude=()) -> int:
        return self.storages(exclude).nbytes


@contextmanager
def saved_for_backward():
    """Record every tensor autograd saves for backward inside the block (through saved_tensors_hooks).

    Code that installs its own saved-tensor hooks inside the block takes precedence for
    what it saves; what its hooks keep is then an ordinary Python object, which
    ``live_storages`` sees.
    """
    record = SavedForBackward()
    with saved_tensors_hooks(record._pack, record._unpack):
        yield record

