"""A problem's own test helpers, imported by name: beside its tests, or (its oracles) under tests/oracles/.

A helper that serves one problem lives in that problem's folder, so a hidden test set laid
out like practice/ carries it along.  The folder's ``conftest.py`` (which pytest loads
before the folder's tests) calls::

    import_siblings(__file__, "shard_match")

after which the tests write ``from shard_match import held_tensors``.  The module is loaded
from the folder by path (no ``sys.path`` change, nothing from the repository root), and it
travels to the ranks by value with the rank functions that use it, since the ranks cannot
import the folder by name.

A helper that computes expected values or holds the statement's rules worked out (an oracle: a
single-process reference run, a schedule simulator) is an answer, so it stays out of the learner's
folder: it lives in ``tests/oracles/<number>_<slug>/``, and the folder's conftest.py calls::

    import_oracles(__file__, "ckpt_data")

A hidden test set laid out like practice/ (``hidden/125_checkpoint_resume/conftest.py``, or a folder
named just ``125``) makes the same call and gets the same modules.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import cloudpickle


ORACLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "oracles")


def import_siblings(anchor_file: str, *names: str) -> list:
    """Import ``<name>.py`` from ``anchor_file``'s folder as module ``name``, for each name; returns the modules."""
    return _import_from(os.path.dirname(os.path.abspath(anchor_file)), anchor_file, names)


def import_oracles(anchor_file: str, *names: str) -> list:
    """Import ``<name>.py`` from tests/oracles/<the problem of anchor_file's folder>/, for each name."""
    number = os.path.basename(os.path.dirname(os.path.abspath(anchor_file))).split("_", 1)[0]
    found = [f for f in os.listdir(ORACLES) if f.split("_", 1)[0] == number] if number.isdigit() else []
    if len(found) != 1:
        raise ImportError(f"{anchor_file}: its folder is not named <number>_<slug> (or <number>) after a problem "
                          f"with oracles in {ORACLES}")
    return _import_from(os.path.join(ORACLES, found[0]), anchor_file, names)


def _import_from(folder: str, anchor_file: str, names) -> list:
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
