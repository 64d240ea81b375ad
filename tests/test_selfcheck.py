"""Every problem's tests accept its reference (also under the device audit: its tensors stay on harness.device()),
reject its stub cleanly, and reject every known-wrong version.

Runs ``judge.py selfcheck N`` per problem, exactly as an instructor would.
"""
import json

import pytest

from kit import catalogue
from tests.judge_helpers import judge  # noqa: F401  (fixture)


@pytest.mark.parametrize("number", sorted(catalogue.load()))
def test_selfcheck(judge, number):
    out = judge("selfcheck", number, "--device-audit", "--format", "json", timeout=1500)
    rows = json.loads(out.stdout) if out.stdout.strip().startswith("[") else []
    surprises = [f"{r['target']}: {r['detail']}" for r in rows if not r["ok"]]
    assert rows and not surprises and out.returncode == 0, "\n".join(surprises) or out.stdout + out.stderr
    assert len([r for r in rows if r["target"].startswith("wrong:")]) >= 5
