"""What a learner's folder holds: the stub, the statement, the public tests and helpers that are no answers."""
import ast
import json
import os

import pytest

from kit import catalogue
from tests.judge_helpers import judge  # noqa: F401  (fixture)

PROBLEMS = catalogue.load()


def defined_names(path: str, methods: bool) -> set:
    """Top-level functions, classes and assigned names (with ``methods``, the classes' methods too), without
    their leading underscores: ``_warmup`` in the reference and ``warmup`` in a helper are one name."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if methods and isinstance(node, ast.ClassDef):
                names.update(m.name for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)))
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n.lstrip("_") for n in names if not (n.startswith("__") and n.endswith("__"))}


def helpers(problem) -> list:
    """The .py files of a practice folder other than the stub, its tests and its conftest.py."""
    folder = os.path.dirname(problem.practice_file())
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py") and f != problem.file
                  and f != "conftest.py" and not f.startswith("test_"))


@pytest.mark.parametrize("number", sorted(PROBLEMS))
def test_no_helper_in_a_learners_folder_defines_what_the_reference_defines(number):
    """#30: practice/122_*/virtual_stages.py held the interleaved schedule and its simulator (needs, warmup,
    timeline: the reference's _needs, _warmup, _timeline).  Such oracles live in tests/oracles/."""
    problem = PROBLEMS[number]
    reference = defined_names(problem.solution_file(), methods=True) - {"init"}
    for path in helpers(problem):
        shared = sorted(defined_names(path, methods=False) & reference)
        assert not shared, (f"{os.path.relpath(path)} defines {', '.join(shared)}, as the reference does: "
                            "move it to tests/oracles/ (testkit.siblings.import_oracles)")


@pytest.mark.parametrize("folder", ["125_checkpoint_resume", "125"])
def test_a_hidden_test_set_uses_the_oracles_the_public_tests_use(judge, tmp_path, folder):
    """#30: with the oracles out of practice/, a hidden set laid out like practice/ still gets them, by the same
    conftest.py line as the public tests."""
    hidden = tmp_path / "hidden" / folder
    hidden.mkdir(parents=True)
    (hidden / "conftest.py").write_text("from testkit.siblings import import_oracles\n\n"
                                        "import_oracles(__file__, 'ckpt_data')\n")
    (hidden / "test_hidden.py").write_text(
        "import harness\nfrom ckpt_data import epoch_batches\n\n"
        "def test_the_statements_worked_example(target):\n"
        "    harness.check(epoch_batches(7, 3, 5, 4) == (1, [3, 0, 6]), 'step 4 of the worked example')\n")
    out = judge(125, "--solution", "--tests", tmp_path / "hidden", "--format", "json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert [t["outcome"] for t in json.loads(out.stdout)["tests"]] == ["passed"]
