"""Correct but unusual solutions score full marks: the tests judge behaviour and measured memory, not a design.

Each file under tests/alternates/<number>_<slug>/ is a complete, correct solution built differently from the
reference (state in module-level dicts, closures, one flat buffer, recompute instead of hooks).  A property
that rejects one of them is asking for more than its statement says.
"""
import glob
import json
import os

import pytest

from tests.judge_helpers import ROOT, judge  # noqa: F401  (fixture)

ALTERNATES = sorted(glob.glob(os.path.join(ROOT, "tests", "alternates", "*", "*.py")))


@pytest.mark.parametrize("path", ALTERNATES, ids=lambda p: os.path.relpath(p, os.path.join(ROOT, "tests", "alternates")))
def test_alternate_solution_scores_full_marks(judge, path):
    problem = os.path.basename(os.path.dirname(path)).split("_")[0]   # the folder is named like practice/'s
    out = judge(problem, "--target", path, "--profile", "quick", "--format", "json", timeout=1500)
    report = json.loads(out.stdout) if out.stdout.strip().startswith("{") else None
    assert report is not None, out.stdout + out.stderr
    failed = [f"{t['name']}: {t['message']}" for t in report["tests"] if t["outcome"] != "passed"]
    assert report["score"] == report["max_score"] and not failed and out.returncode == 0, "\n".join(failed)
