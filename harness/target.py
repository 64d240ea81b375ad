"""The learner's implementation file, named by path and loaded only inside the ranks.

The test process never imports learner code: it only checks, with ``ast``, that
the file parses and defines the required names.  So a submission cannot patch
the test process, and a syntax error becomes a clear ``TargetError``.

The file travels to the ranks by content (``source``), read once in the test process: a rank
needs no access to the folder it lives in (the kit's own folders are hidden from ranks, and a
rank may run as another uid than the judge's), and every rank runs exactly the text that was
validated, however the file changes on disk meanwhile.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import linecache
import os
import sys
import types
from dataclasses import dataclass, field

from . import standins
from .errors import TargetError

_LOADED: dict = {}


@dataclass(frozen=True)
class Target:
    path: str
    names: tuple = field(default=())   # the public names the problem requires
    stand_ins: tuple = field(default=())   # torch's own implementations it may not use (``standins``)
    source: str | None = field(default=None, repr=False, compare=False)   # the file's text, once read

    def with_source(self) -> "Target":
        """This target carrying its file's text (read now, unless it already carries it)."""
        if self.source is not None:
            return self
        with open(self.path, encoding="utf-8", errors="replace") as f:
            return dataclasses.replace(self, source=f.read())

    def validate(self) -> "Target":
        """Check the file without running it.  Raises TargetError in plain words."""
        if not os.path.isfile(self.path):
            raise TargetError(f"target file not found: {self.path}")
        target = self.with_source()
        source = target.source
        try:
            tree = ast.parse(source, filename=self.path)
        except SyntaxError as e:
            raise TargetError(f"syntax error in {self.path}:{e.lineno}: {e.msg}\n    {(e.text or '').rstrip()}") from None
        defined = _top_level_names(tree, self.path)
        missing = [n for n in self.names if n not in defined]
        if missing:
            raise TargetError(f"{self.path} does not define {', '.join(missing)} "
                              f"(the problem needs: {', '.join(self.names)})")
        return target

    def digest(self) -> str:
        """What names this target's content (the file's text)."""
        return hashlib.sha256(f"{os.path.abspath(self.path)}\0{self.with_source().source}".encode()).hexdigest()

    def load(self):
        """Import the file's text (inside a rank), once per content; returns the module.  Tracebacks and
        hang reports show its lines: the text is in ``linecache`` under the file's own name."""
        target = self.with_source()
        key = target.digest()
        module = _LOADED.get(key)
        if module is None:
            path = os.path.abspath(self.path)
            name = "kit_target_" + key[:12]
            module = types.ModuleType(name)
            module.__file__ = path
            sys.modules[name] = module
            linecache.cache[path] = (len(target.source), None, target.source.splitlines(True), path)
            refused = standins.guard(self.stand_ins, path)
            exec(compile(target.source, path, "exec", dont_inherit=True), vars(module))   # not our __future__ flags
            standins.check(module, refused)
            _LOADED[key] = module
        return module


def _top_level_names(tree: ast.Module, path: str | None = None) -> set:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        if path is not None and _copies_reference(node):  # reference_of(__file__, into=globals())
            names.update(_public_reference_names(path))
    return names


def _copies_reference(node) -> bool:
    """A top-level ``reference_of(..., into=...)`` call, bare or assigned."""
    value = node.value if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign)) else None
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return name == "reference_of" and any(k.arg == "into" for k in value.keywords)


def _public_reference_names(wrong_version_file: str) -> set:
    """The public top-level names of the reference beside a wrong version, read without running it."""
    try:
        path = _reference_path(wrong_version_file)
        with open(path, encoding="utf-8", errors="replace") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, TargetError):
        return set()
    return {n for n in _top_level_names(tree) if not n.startswith("_")}


def _reference_path(wrong_version_file: str) -> str:
    folder = os.path.dirname(os.path.dirname(os.path.abspath(wrong_version_file)))
    files = sorted(f for f in os.listdir(folder) if f.endswith(".py"))
    if len(files) != 1:
        raise TargetError(f"expected exactly one reference .py file in {folder}, found {files}")
    return os.path.join(folder, files[0])


def reference_of(wrong_version_file: str, into: dict | None = None):
    """The reference module beside a known-wrong version (``solutions/<problem>/wrong/x.py``).

    Known-wrong versions import it and change only the part they get wrong, so each
    file shows its bug and nothing else.  With ``into=globals()`` the reference's public
    names (those not starting with ``_``) are copied into the caller's namespace first,
    so the wrong version defines only what it changes::

        ref = reference_of(__file__, into=globals())
    """
    module = Target(_reference_path(wrong_version_file)).load()
    if into is not None:
        into.update({name: value for name, value in vars(module).items() if not name.startswith("_")})
    return module
