"""Every problem's tests accept each of its alternates, reject its stub cleanly, and reject every known-wrong
version; the reference is judged by the practice run (``pytest --solution``, always under the device audit: its
tensors stay on harness.device()), so selfcheck leaves it out here (``--skip-reference``).

An alternate (tests/alternates/<number>_<slug>/) is a complete, correct solution built differently from the
reference (state in module-level dicts, closures, one flat buffer, recompute instead of hooks): a property that
rejects one asks for more than its statement says.

Runs ``judge.py selfcheck N`` per problem, as an instructor would, with the quick profile.
"""
import json

import pytest

from kit import catalogue
from tests.judge_helpers import judge  # noqa: F401  (fixture)


@pytest.mark.parametrize("number", sorted(catalogue.load()))
def test_selfcheck(judge, number):
    out = judge("selfcheck", number, "--skip-reference", "--profile", "quick", "--format", "json", timeout=1500)
    rows = json.loads(out.stdout) if out.stdout.strip().startswith("[") else []
    surprises = [f"{r['target']}: {r['detail']}" for r in rows if not r["ok"]]
    assert rows and not surprises and out.returncode == 0, "\n".join(surprises) or out.stdout + out.stderr
    assert len([r for r in rows if r["target"].startswith("wrong:")]) >= 5
    assert len([r for r in rows if r["target"].startswith("alternate:")]) >= 2
