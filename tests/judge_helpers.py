"""Shared by the judge and workflow tests: run judge.py as a subprocess, as a person would."""
import os
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
