"""A problem folder's own test helpers (``shard_match.py`` beside ``test_tensor_parallel.py``), imported by name.

A helper that serves one problem lives in that problem's folder, so a hidden test set laid
out like practice/ carries it along.  The folder's ``conftest.py`` (which pytest loads
before the folder's tests) calls::

    import_siblings(__file__, "shard_match")

after which the tests write ``from shard_match import held_tensors``.  The module is loaded
from the folder by path (no ``sys.path`` change, nothing from the repository root), and it
travels to the ranks by value with the rank functions that use it, since the ranks cannot
import the folder by name.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import cloudpickle


def import_siblings(anchor_file: str, *names: str) -> list:
    """Import ``<name>.py`` from ``anchor_file``'s folder as module ``name``, for each name; returns the modules."""
    folder = os.path.dirname(os.path.abspath(anchor_file))
    modules = []
    for name in names:
        path = os.path.join(folder, f"{name}.py")
        module = sys.modules.get(name)
        if module is None or os.path.abspath(getattr(module, "__file__", None) or "") != path:
            if not os.path.isfile(path):
                raise ImportError(f"{anchor_file} needs {name}.py beside it: {path} not found")
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        cloudpickle.register_pickle_by_value(module)   # ranks get its functions with the rank function
        modules.append(module)
    return modules
