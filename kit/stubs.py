"""The committed stub of a problem: recognising one, finding it in git, and --reset."""
from __future__ import annotations

import ast
import os
import subprocess
import time

from .catalogue import Problem
from .config import ROOT
from .judging import UsageError
from .report import relative


def is_stub(source: str, names) -> bool:
    """Every public function raises NotImplementedError, and every public class has such a method, except
    a class the stub gives whole: one with no method of its own (``class ScheduleDeadlock(RuntimeError): ...``,
    a dataclass, a NamedTuple)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False

    def raises_nie(fn) -> bool:
        return any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n) for n in ast.walk(fn))

    found = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for name in names:
        node = found.get(name)
        if isinstance(node, ast.FunctionDef) and not raises_nie(node):
            return False
        if isinstance(node, ast.ClassDef) and not _given_whole(node) and not any(
                isinstance(m, ast.FunctionDef) and raises_nie(m) for m in node.body):
            return False
    return any(isinstance(n, ast.Raise) for n in ast.walk(tree))


def _given_whole(node: ast.ClassDef) -> bool:
    """A class with no method of its own: data or an exception, nothing for the learner to write."""
    return not any(isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) for m in node.body)


def pristine_stub(problem: Problem) -> str:
    """The newest committed version of the practice file that is still a stub."""
    rel = f"practice/{problem.folder}/{problem.file}"
    try:
        commits = subprocess.run(["git", "log", "--format=%H", "--", rel], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        raise UsageError("--reset needs the kit's git history, and this checkout has none") from None
    for commit in commits:
        source = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True,
                                text=True).stdout
        if is_stub(source, problem.names):
            return source
    raise UsageError(f"no committed stub of {rel} was found in git history")


def reset(problem: Problem, state_dir: str, ask=input) -> str:
    """Restore the stub after ``ask(question)`` answers yes.  No answer to read (stdin closed or
    not a terminal, ``EOFError``) is a UsageError that says to add --yes; the file is left alone."""
    path = problem.practice_file()
    stub = pristine_stub(problem)
    with open(path, encoding="utf-8") as f:
        current = f.read()
    if current == stub:
        return f"{relative(path)} is already the stub; nothing to do."
    try:
        answer = ask(f"Restore {relative(path)} to the stub? Your version is backed up first. [y/N] ")
    except EOFError:
        raise UsageError(f"--reset asks before it overwrites {relative(path)}, and there is no answer to read "
                         "(no terminal). Your file is unchanged. To restore the stub without asking, add --yes: "
                         f"python judge.py {problem.number} --reset --yes") from None
    if answer.strip().lower() not in ("y", "yes"):
        return "Left your file as it is."
    backup_dir = os.path.join(state_dir, "backups", problem.folder)
    os.makedirs(backup_dir, exist_ok=True)
    stem, ext = os.path.splitext(problem.file)
    backup = os.path.join(backup_dir, f"{stem}.{time.strftime('%Y%m%d-%H%M%S')}{ext}")
    with open(backup, "w", encoding="utf-8") as f:
        f.write(current)
    with open(path, "w", encoding="utf-8") as f:
        f.write(stub)
    return f"Restored the stub. Your version is saved as {relative(backup)}"


