"""Notebook mode (kit/notebook.py), run as a learner runs it: real notebooks, executed headless by nbclient on a
real ipykernel, with the extension loaded by ``%load_ext kit.notebook``; the checks read the cells' outputs.

One kernel runs the ``%%ranks`` and ``%%judge`` cells (once per test session, also under pytest-xdist: the
first worker to need it runs it, the others read what it saved); another runs the committed notebook of
problem 113 with the reference pasted into its stub cell.
"""
import ast
import fcntl
import json
import os
import re
import time

import pytest

pytest.importorskip("nbclient", reason="notebook mode's extra is not installed: pip install -e '.[notebook]'")
pytest.importorskip("ipykernel", reason="notebook mode's extra is not installed: pip install -e '.[notebook]'")
nbformat = pytest.importorskip("nbformat", reason="notebook mode's extra is not installed: pip install -e '.[notebook]'")

from nbclient import NotebookClient  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "solutions", "113_ddp_buckets", "ddp_buckets.py")
WRONG = os.path.join(ROOT, "solutions", "113_ddp_buckets", "wrong", "buckets_first_to_last.py")
NOTEBOOK = os.path.join(ROOT, "notebooks", "113_ddp_buckets.ipynb")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def wrong_submission() -> str:
    """The known-wrong version as one file: it borrows the rest from the reference beside it
    (``reference_of(__file__)``), which a cell has no folder for, so the reference comes first and its wrong
    ``make_buckets`` after, replacing the reference's."""
    wrong = _read(WRONG)
    node = next(n for n in ast.parse(wrong).body if isinstance(n, ast.FunctionDef) and n.name == "make_buckets")
    return _read(REFERENCE) + "\n\n" + ast.get_source_segment(wrong, node) + "\n"


RANKS_CELLS = {
    "load": "%load_ext kit.notebook",
    "allreduce": "%%ranks 2\nt = torch.full((2,), float(rank + 1))\ndist.all_reduce(t)\nprint('reduced', t.tolist())\nt",
    "set": "%%ranks 2\nsecret = 100 + rank\nprint('set', secret)",
    "get": "%%ranks 2\nprint('got', secret)\nsecret * 2",
    "one_rank": "%%ranks 2 --rank 1\nprint('only', rank, secret)",
    "raises": "%%ranks 2\nprint('before the error on', rank)\nif rank == 1:\n    raise ValueError('rank one is unhappy')",
    "hang": "%%ranks 2 --timeout 2\nt = torch.zeros(1)\nprint('waiting on', rank)\nif rank == 0:\n    dist.recv(t, src=1)",
    "judge_missing": "%judge 999\n%judge 113 --target no/such/file.py",
    "judge_wrong": "%%judge 113 --profile quick --seed 1 -k test_bucket_contract\n" + wrong_submission(),
    "after": "%%ranks 2\nprint('fresh', rank)",
    "pid": "import os\nfrom kit import notebook\nprint(notebook._RANKS.folder, notebook._RANKS.shared.path, os.getpid())",
}


def _processes() -> dict:
    """pid -> parent pid, of every process (from /proc: psutil is not a dependency)."""
    parents = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return parents


def descendants(pid: int) -> list:
    parents, found, frontier = _processes(), [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_notebook(cells: list, cwd: str = ROOT, env: dict | None = None) -> dict:
    """Execute ``cells`` (sources) in a fresh kernel; returns the executed notebook, each cell's seconds, and the
    kernel's process tree before shutdown with which of it was still alive a few seconds after."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": cwd}})
    kernel_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    seconds, tree, folders = [], [], []
    with client.setup_kernel(env=kernel_env):
        kernel = client.km.provisioner.process
        for index, cell in enumerate(nb.cells):
            started = time.monotonic()
            client.execute_cell(cell, index)
            seconds.append(time.monotonic() - started)
        if cells[-1] == RANKS_CELLS["pid"]:
            *folders, pid = texts(nb.cells[-1])[-1].split()
            tree = [int(pid)] + descendants(int(pid))
    deadline, alive = time.monotonic() + 8, list(tree)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if _alive(p)]
    return {"nb": json.loads(json.dumps(nb)), "seconds": seconds, "tree": tree, "alive": alive,
            "exit": kernel.poll(), "left": [f for f in folders if os.path.exists(f)]}


def once(tmp_path_factory, name: str, make):
    """``make()``'s result, made by one pytest process of the session (the xdist workers share the folder)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    saved = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not saved.exists():
            saved.write_text(json.dumps(make()))
    return json.loads(saved.read_text())


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    names = list(RANKS_CELLS)
    done = once(tmp_path_factory, "notebook-ranks", lambda: run_notebook(list(RANKS_CELLS.values())))
    return {**done, "cells": dict(zip(names, done["nb"]["cells"])), "seconds": dict(zip(names, done["seconds"]))}


def texts(cell) -> list:
    """Every text/plain (and stream text) the cell put out."""
    found = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            found.append(out["text"])
        elif "text/plain" in out.get("data", {}):
            found.append(out["data"]["text/plain"])
    return found


def htmls(cell) -> list:
    return [out["data"]["text/html"] for out in cell.get("outputs", []) if "text/html" in out.get("data", {})]


def text(cell) -> str:
    return "\n".join(texts(cell))


def test_a_ranks_cell_that_all_reduces_shows_each_ranks_reduced_value(ranks):
    cell = ranks["cells"]["allreduce"]
    out = text(cell)
    for r in (0, 1):
        assert f"rank {r} | reduced [3.0, 3.0]" in out, out
        assert f"rank {r} | Out: tensor shape [2] float32 on cpu: [3, 3]" in out, out
    page = htmls(cell)[0]
    assert 'class="rank" data-rank="0"' in page and 'class="rank" data-rank="1"' in page, page
    assert "reduced [3.0, 3.0]" in page and "<script" not in page


def test_the_timeline_of_a_cell_is_drawn_inline_one_lane_per_rank(ranks):
    cell = ranks["cells"]["allreduce"]
    timeline = next((h for h in htmls(cell) if "<svg" in h), None)
    assert timeline is not None, texts(cell)
    assert re.search(r'<g class="lane" data-rank="0"', timeline) and re.search(r'<g class="lane" data-rank="1"', timeline)
    assert 'data-kind="all_reduce"' in timeline
    assert "<body" not in timeline and ".kit-nb-timeline svg text" in timeline, "a fragment, its stylesheet scoped"
    assert any(t.startswith("timeline of cell") for t in texts(cell)), texts(cell)
    assert not any("<svg" in h for h in htmls(ranks["cells"]["set"])), "no communication, no timeline"


def test_each_rank_keeps_its_own_namespace_across_cells(ranks):
    out = text(ranks["cells"]["get"])
    assert "rank 0 | got 100" in out and "rank 1 | got 101" in out, out
    assert "rank 0 | Out: 200" in out and "rank 1 | Out: 202" in out, out


def test_rank_option_shows_one_ranks_output_only(ranks):
    out = text(ranks["cells"]["one_rank"])
    assert "rank 1 | only 1 101" in out and "rank 0 |" not in out, out


def test_a_rank_that_raises_shows_its_traceback_and_what_each_rank_printed(ranks):
    cell = ranks["cells"]["raises"]
    out = text(cell)
    assert "rank 1 raised ValueError: rank one is unhappy" in out, out
    n = cell["execution_count"]   # the cell's file is named by its In[n], its lines numbered as the cell shows them
    assert f'File "cell{n}.py", line 4, in <module>\n    raise ValueError(\'rank one is unhappy\')' in out, out
    assert "notebook.py" not in out, "the extension's own frame is not the learner's"
    assert "rank 0 | before the error on 0" in out and "rank 1 | before the error on 1" in out, out
    assert any('class="error"' in h and "RankError" in h for h in htmls(cell))


def test_a_hang_ends_within_seconds_with_the_harness_diagnosis(ranks):
    cell = ranks["cells"]["hang"]
    out = text(cell)
    assert "the ranks did not finish within 2 s" in out, out
    assert "diagnosis: rank 0 waits in recv() for a message from rank 1" in out, out
    assert f"rank 0 is blocked at: cell{cell['execution_count']}.py:5 in <module>: dist.recv(t, src=1)" in out, out
    assert "rank 0 | waiting on 0" in out, "what a hung rank printed before it hung is shown"
    assert "starts fresh ranks" in out, "the cell says that the world was replaced"
    assert ranks["seconds"]["hang"] < 12, ranks["seconds"]


def test_judge_cell_scores_a_wrong_version_zero_and_shows_its_first_failure(ranks):
    """On the property the known-wrong version breaks (-k); the reference, whole, is judged by the last test."""
    wrong = ranks["cells"]["judge_wrong"]
    assert re.search(r'data-score="0/3"', htmls(wrong)[0]), text(wrong)
    out = text(wrong)
    assert "score: 0/3" in out and "profile: quick" in out, out
    assert "✗ test_bucket_contract" in out and "[[0, 1], [2, 3]]" in out, out
    assert re.search(r"rerun just this case: %%judge 113 -k test_bucket_contract --seed 1 --profile quick", out), out
    assert "target: this cell" in out and "kit-nb-judge" not in out, out


def test_judge_says_what_it_cannot_judge_without_starting_a_judge(ranks):
    out = text(ranks["cells"]["judge_missing"])
    assert "UsageError: no problem 999; the problems are 111, 112, 113" in out, out
    assert re.search(r"UsageError: no file \S*no/such/file.py", out), out


def test_after_a_hang_the_next_cell_runs_on_fresh_ranks_and_says_so(ranks):
    out = text(ranks["cells"]["after"])
    assert "rank 0 | fresh 0" in out and "rank 1 | fresh 1" in out, out
    assert "note: fresh ranks" in out and "variables of earlier cells are gone" in out, out


def test_no_process_is_left_after_the_kernel_shuts_down(ranks):
    tree = ranks["tree"]
    assert len(tree) >= 4, f"the kernel, the forkserver and two ranks at least: {tree}"
    assert ranks["alive"] == [], f"still alive after the kernel shut down: {ranks['alive']} of {tree}"
    assert ranks["exit"] == 0, f"the kernel did not exit by itself on the shutdown request: {ranks['exit']}"
    assert ranks["left"] == [], f"its atexit handlers did not remove {ranks['left']}"


def test_the_problem_notebook_is_current_and_scores_full_marks_with_the_reference_pasted_in(tmp_path):
    from kit import catalogue
    from kit.notebook import make_notebook
    committed = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(committed)
    assert json.loads(_read(NOTEBOOK)) == make_notebook(catalogue.load()[113]), \
        "notebooks/113_ddp_buckets.ipynb is not what `python -m kit.notebook make 113` writes now"
    sources = [c.source for c in committed.cells if c.cell_type == "code"]
    assert sources[0] == "%load_ext kit.notebook"
    stub = next(i for i, s in enumerate(sources) if s.startswith("%%judge 113\n"))
    assert "raise NotImplementedError" in sources[stub]
    sources[stub] = "%%judge 113\n" + _read(REFERENCE)
    done = run_notebook(sources, cwd=os.path.dirname(NOTEBOOK), env={"KIT_PROFILE": "quick"})
    cells = done["nb"]["cells"]
    assert not any(o.get("output_type") == "error" for c in cells for o in c["outputs"])
    assert "rank 1 | Out: tensor shape [3] float32 on cpu: [0, 3, 6]" in text(cells[1]), text(cells[1])
    got, full = map(int, re.search(r'data-score="(\d+)/(\d+)"', htmls(cells[stub])[0]).groups())
    assert got == full > 0, text(cells[stub])
    out = text(cells[stub])
    assert f"score: {full}/{full}" in out and "target: this cell   profile: quick" in out, out
    assert re.search(r"test_ddp_matches_single_process_training +3/3 +pass", out), out
