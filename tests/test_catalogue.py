"""problems.yaml is validated at load, with errors that say where and what."""
from pathlib import Path

import pytest

from kit import catalogue

ROOT = Path(__file__).resolve().parent.parent

GOOD = """
problems:
  - number: 113
    slug: ddp_buckets
    title: DDP
    difficulty: easy
    topic: data parallel
    file: ddp_buckets.py
    names: [make_buckets]
"""


def _load(tmp_path, text):
    path = tmp_path / "problems.yaml"
    path.write_text(text)
    return catalogue.load(str(path))


def test_the_kit_catalogue_loads_and_every_problem_has_its_files():
    problems = catalogue.load()
    folders = sorted(d.name for d in (ROOT / "practice").iterdir() if d.is_dir() and d.name[:3].isdigit())
    assert sorted(p.folder for p in problems.values()) == folders
    for p in problems.values():
        assert p.hints, f"problem {p.number} has no hints"
        assert p.wrong_files(), f"problem {p.number} has no known-wrong versions"


def test_a_good_entry_loads(tmp_path):
    p = _load(tmp_path, GOOD)[113]
    assert p.folder == "113_ddp_buckets" and p.names == ("make_buckets",) and p.points_for("test_x") == 1


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("    names: [make_buckets]\n", "    names: [make_buckets]\n    colour: red\n"), "unknown key colour"),
    (GOOD.replace("    topic: data parallel\n", ""), "missing topic"),
    (GOOD + GOOD.split("problems:\n")[1], "duplicate problem number 113"),
    (GOOD.replace("easy", "trivial"), "difficulty must be one of"),
    (GOOD.replace("    names: [make_buckets]\n", "    names: [make_buckets]\n    forbidden_ops: [allreduce]\n"),
     "unknown op kinds allreduce"),
    ("problems: [\n", "not valid YAML"),
    ("- 1\n- 2\n", "must be a mapping with a 'problems:' list"),
])
def test_malformed_catalogue_is_rejected_with_a_clear_error(tmp_path, text, message):
    with pytest.raises(catalogue.CatalogueError, match=message):
        _load(tmp_path, text)


def test_problem_for_path_reads_the_folder_number():
    problems = catalogue.load()
    assert catalogue.problem_for_path("/x/hidden/113_ddp_buckets/test_a.py", problems).number == 113
    assert catalogue.problem_for_path("/x/hidden/113/test_a.py", problems).number == 113
    assert catalogue.problem_for_path("/x/hidden/misc/test_a.py", problems) is None


def _code_lines(path: str) -> set:
    """The reference's lines of code, spaces and comments aside, long enough to be more than a name."""
    import re
    lines = (re.sub(r"\s+", "", line.split("#")[0]) for line in open(path, encoding="utf-8"))
    return {line for line in lines if len(line) >= 20}


def test_a_hint_is_a_hint_not_the_references_code():
    """#30: 126's first hint was the whole bf16 hook, line by line.  A hint may quote one line of the reference
    (a call to use, a formula), never two."""
    import re
    for number, problem in catalogue.load().items():
        reference = _code_lines(problem.solution_file())
        for i, hint in enumerate(problem.hints, 1):
            quoted = [line for line in reference if line in re.sub(r"\s+", "", hint)]
            assert len(quoted) <= 1, f"problem {number}, hint {i} spells out the reference: {quoted}"
