"""``judge.py new`` lays a problem out whole, and the catalogue checks catch what no longer agrees."""
import os
import shutil
import subprocess
import sys

import pytest

from kit import catalogue, scaffold
from tests.judge_helpers import ROOT


def test_the_kits_catalogue_agrees_with_its_files():
    assert scaffold.out_of_sync(catalogue.load()) == []


@pytest.fixture(scope="module")
def kit_copy(tmp_path_factory):
    """A copy of the kit (no .git, no state) with problem 199 laid out by ``judge.py new``."""
    copy = tmp_path_factory.mktemp("kit") / "kit"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".kit", "__pycache__", "*.egg-info", ".ci"))
    out = subprocess.run([sys.executable, "judge.py", "new", "199", "all_reduce_sum", "--title", "A sum"],
                         cwd=copy, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "practice/199_all_reduce_sum/all_reduce_sum.py" in out.stdout
    return copy


def test_new_lays_out_every_file_a_problem_has(kit_copy):
    problems = catalogue.load(str(kit_copy / "problems.yaml"))
    p = problems[199]
    for path in (f"practice/{p.folder}/{p.file}", f"practice/{p.folder}/README.md", f"practice/{p.folder}/README.zh.md",
                 f"practice/{p.folder}/test_all_reduce_sum.py", f"solutions/{p.folder}/{p.file}",
                 f"solutions/{p.folder}/wrong/forgets_the_all_reduce.py"):
        assert (kit_copy / path).is_file(), path
    assert (kit_copy / "tests" / "alternates" / p.folder).is_dir()
    assert scaffold.out_of_sync(problems, root=str(kit_copy)) == []
    assert "| 199 | [A sum](practice/199_all_reduce_sum/README.md) | medium | model parallel |" in \
        (kit_copy / "README.md").read_text()


def test_the_new_problem_judges_its_reference_stub_and_wrong_version(kit_copy):
    out = subprocess.run([sys.executable, "judge.py", "selfcheck", "199", "--profile", "quick", "--format", "json"],
                         cwd=kit_copy, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SURPRISE" not in out.stdout and '"target": "wrong:forgets_the_all_reduce"' in out.stdout


def test_new_refuses_a_number_in_use_and_a_bad_slug(kit_copy):
    for args, message in ((["113", "again"], "problem 113 exists already"), (["198", "Bad-Slug"], "slug 'Bad-Slug'")):
        out = subprocess.run([sys.executable, "judge.py", "new", *args], cwd=kit_copy, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 4 and message in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("breakage, expected", [
    ("points", "problem 199: points names test_renamed, which is no test"),
    ("readme_table", "README.md: the problem table is not the catalogue's"),
    ("readme_zh_table", "README.zh.md: the problem table is not the catalogue's"),
    ("property_list", "problem 199: the statement's property list names [] that are no tests, and not the tests "
                      "['test_matches_the_sum_over_ranks']"),
    ("trace_test", "problem 199: trace_test names test_gone"),
    ("cost", "problem 199: its cost figure 'bytes per rank' = 'N · B' is not derived in its statement's concept"),
    ("no_cost", "problem 199: no cost model"),
])
def test_a_broken_catalogue_is_caught(kit_copy, tmp_path, breakage, expected):
    broken = tmp_path / "kit"
    shutil.copytree(kit_copy, broken)
    yaml, readme = broken / "problems.yaml", broken / "README.md"
    statement = broken / "practice" / "199_all_reduce_sum" / "README.md"
    if breakage == "points":
        yaml.write_text(yaml.read_text().replace("test_matches_the_sum_over_ranks: 1", "test_renamed: 1"))
    elif breakage == "readme_table":
        readme.write_text(readme.read_text().replace("| 199 | [A sum]", "| 199 | [A total]"))
    elif breakage == "readme_zh_table":
        zh = broken / "README.zh.md"
        zh.write_text(zh.read_text().replace("| 199 |", "| 198 |"))
    elif breakage == "property_list":
        statement.write_text(statement.read_text().replace("* `test_matches_the_sum_over_ranks`:", "* The sum:"))
    elif breakage == "no_cost":
        yaml.write_text(yaml.read_text().replace('    cost:\n      messages per rank: "1"\n', ""))
    elif breakage == "cost":
        yaml.write_text(yaml.read_text().replace('messages per rank: "1"', "bytes per rank: N · B"))
    else:
        yaml.write_text(yaml.read_text().replace("    file: all_reduce_sum.py\n",
                                                 "    file: all_reduce_sum.py\n    trace_test: test_gone\n"))
    found = scaffold.out_of_sync(catalogue.load(str(yaml)), root=str(broken))
    assert any(line.startswith(expected) for line in found), found
