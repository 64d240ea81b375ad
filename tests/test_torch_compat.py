"""The kit runs on every torch pyproject.toml accepts, not only the one it was built with.

torch 2.13 renamed ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to ``all_gather_single`` /
``reduce_scatter_single`` and warns on the old names. The new names do not exist before 2.13, so the
kit's code and statements use the old ones, and the ranks silence the warning. ``python -m
harness.compat --torch X`` runs the whole suite on another torch; these tests keep it passing there.
"""
import io
import os
import re
import tokenize
import warnings

import pytest
import torch
import torch.distributed as dist

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED = ("solutions", "practice", "harness")
NEW_NAMES = ("all_gather_single", "reduce_scatter_single")
# in prose and docstrings: `dist.all_gather_single`, `x.reduce_scatter_single`, `all_gather_single(...)`;
# a bare mention ("torch 2.13 also calls it `all_gather_single`") is allowed
SUGGESTED = re.compile(r"\w\.\s*(%s)\b|\b(%s)\s*\(" % ("|".join(NEW_NAMES), "|".join(NEW_NAMES)))


def _code_lines(text: str) -> set[int]:
    """Lines where a new name is used as code: an attribute, a call, an import (not a string or comment)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return set()
    return {tok.start[0] for tok in tokens if tok.type == tokenize.NAME and tok.string in NEW_NAMES}


def _uses_of_new_names(path: str) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    lines = text.splitlines()
    hits = _code_lines(text) if path.endswith(".py") else set()
    hits |= {n for n, line in enumerate(lines, 1) if SUGGESTED.search(line)}
    return [f"{os.path.relpath(path, ROOT)}:{n}: {lines[n - 1].strip()}" for n in sorted(hits)]


def test_no_collective_names_that_older_torch_lacks():
    found = []
    for top in SCANNED:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for name in sorted(files):
                if name.endswith((".py", ".md")):
                    found += _uses_of_new_names(os.path.join(folder, name))
    if found:
        pytest.fail(f"{len(found)} use(s) of {' / '.join(NEW_NAMES)}, which torch before 2.13 lacks "
                    "(AttributeError there); use dist.all_gather_into_tensor / dist.reduce_scatter_tensor:\n  "
                    + "\n  ".join(found), pytrace=False)


def test_the_scan_sees_code_and_suggestions_but_not_mentions(tmp_path):
    flagged = {
        "a.py": "import torch.distributed as dist\ndist.all_gather_single(out, x)\n",
        "b.py": "from torch.distributed import (\n    reduce_scatter_single,\n)\n",
        "c.py": '"""Call ``dist.reduce_scatter_single(out, inp)``."""\n',
        "d.md": "Useful calls: `all_gather_single(out, inp, group=g)`\n",
    }
    allowed = {
        "e.py": "# torch 2.13 also names it all_gather_single\nx = 'reduce_scatter_single'\n",
        "f.md": "torch 2.13 also calls them `reduce_scatter_single` / `all_gather_single` (names older "
                "versions lack)\n",
    }
    for name, text in {**flagged, **allowed}.items():
        (tmp_path / name).write_text(text)
    got = {name for name in {**flagged, **allowed} if _uses_of_new_names(str(tmp_path / name))}
    assert got == set(flagged)


def _gather_then_scatter():
    rank, n = dist.get_rank(), dist.get_world_size()
    with warnings.catch_warnings(record=True) as caught:   # keeps the rank's own filters
        gathered = torch.empty(2 * n)
        dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))
        shard = torch.empty(2)
        dist.reduce_scatter_tensor(shard, torch.arange(2.0 * n))
    return gathered.tolist(), shard.tolist(), [f"{w.category.__name__}: {w.message}" for w in caught]


def test_old_collective_names_are_traced_and_quiet():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")   # pyproject's filterwarnings would hide them here otherwise
        values, trace = harness.run(_gather_then_scatter, 2, timeout=30)
    for rank, (gathered, shard, rank_warnings) in enumerate(values):
        assert gathered == [0.0, 0.0, 1.0, 1.0]
        assert shard == [2.0 * rank * 2, 2.0 * rank * 2 + 2.0]   # sum over 2 ranks of arange(4)[2r:2r+2]
        assert rank_warnings == [], f"rank {rank} saw warnings: {rank_warnings}"
        assert trace.kinds(rank) == ["all_gather", "reduce_scatter"], trace.ops(rank)
        gather, scatter = trace.ops(rank)
        assert (gather.in_bytes, gather.out_bytes) == (8, 16)
        assert (scatter.in_bytes, scatter.out_bytes) == (16, 8)
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert future == [], f"FutureWarning reached the test process: {future}"
    assert hasattr(dist, "all_gather_into_tensor") and hasattr(dist, "reduce_scatter_tensor"), torch.__version__
