"""Shared by the judge and workflow tests: run judge.py as a subprocess, as a person would."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def judge(tmp_path):
    """Run judge.py as a learner would, with its progress state in a private folder."""
    def run(*args, input=None, timeout=600, env=None):
        full_env = dict(os.environ, KIT_STATE_DIR=str(tmp_path / "state"), NO_COLOR="1", **(env or {}))
        return subprocess.run([sys.executable, os.path.join(ROOT, "judge.py"), *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True, input=input, timeout=timeout, env=full_env)
    return run


_NOT_COPIED = {".git", ".venv", ".hypothesis", ".kit", ".ci", "__pycache__", "dist_practice_kit.egg-info"}


def fresh_kit(where):
    """A copy of the kit at ``where`` as a fresh clone has it (tests never edit the real practice/)."""
    shutil.copytree(ROOT, where, ignore=lambda folder, names: [n for n in names if n in _NOT_COPIED])
    return where


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (each test gives its own KIT_STATE_DIR)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


class ProblemWithPracticeFile:
    """A catalogue problem whose practice file is somewhere else (tests never edit practice/)."""

    def __init__(self, problem, path):
        self._problem, self._path = problem, str(path)

    def __getattr__(self, name):
        return getattr(self._problem, name)

    def practice_file(self, root=None):
        return self._path


STUB_113 = os.path.join(ROOT, "practice/113_ddp_buckets/ddp_buckets.py")
MAKE_BUCKETS_STUB = '''    raise NotImplementedError("make_buckets: see README.md, 'make_buckets'")'''


def with_make_buckets(body: str) -> str:
    """Problem 113's stub with make_buckets implemented by ``body`` (indented 4), the rest untouched."""
    stub = open(STUB_113, encoding="utf-8").read()
    assert MAKE_BUCKETS_STUB in stub
    return stub.replace(MAKE_BUCKETS_STUB, body.rstrip("\n"))


# make_buckets that closes a bucket one byte early: fails the statement's first example
BUGGY_MAKE_BUCKETS = '''    buckets, current, used = [], [], 0
    for i in reversed(range(len(sizes))):
        if current and used + sizes[i] >= cap:
            buckets.append(current)
            current, used = [], 0
        current.append(i)
        used += sizes[i]
    if current:
        buckets.append(current)
    return buckets
'''


def hidden_tests(tmp_path, source: str, file: str = "test_hidden.py") -> str:
    """A hidden test set laid out like practice/, holding one test file for problem 113; returns its root."""
    folder = tmp_path / "hidden" / "113_ddp_buckets"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / file).write_text(source)
    return str(tmp_path / "hidden")


# A hidden test of make_buckets: one rank, one fixed case
CAP_OF_ONE_BYTE = (
    "import harness\n\n"
    "def _buckets(target, sizes, cap):\n    return target.load().make_buckets(sizes, cap)\n\n"
    "def test_cap_of_one_byte(target):\n"
    "    got = harness.run(_buckets, 1, target, [3, 1, 2], 1).values[0]\n"
    "    harness.check(got == [[2], [1], [0]], f'make_buckets([3, 1, 2], 1) returned {got}')\n")
