"""Every statement has the one format, names exactly its problem's tests, and its Chinese mirror keeps in step.

The format (practice/<n>_<slug>/README.md): a title line, an introduction, then these sections in order, each
``##``; ``###`` subsections inside them are free.  The property list is one bullet per test, opening with the
test's name in backticks.  README.zh.md has the same sections under their Chinese names, the same number of
subsections, every code span, code block and property name of the English text, and nothing else to sync.
"""
import pytest

from kit import catalogue, statements

PROBLEMS = catalogue.load()


@pytest.fixture(params=sorted(PROBLEMS), ids=str)
def problem(request):
    return PROBLEMS[request.param]


def test_the_statement_has_the_one_format(problem):
    text = statements.read(problem, "en")
    assert statements.sections(text, "en") == list(statements.SECTIONS["en"]), \
        f"{problem.folder}/README.md: its sections must be exactly {list(statements.SECTIONS['en'])}"


def test_the_property_list_names_exactly_the_problems_tests(problem):
    listed = statements.property_names(statements.read(problem, "en"), "en")
    tests = statements.test_names(problem)
    assert sorted(listed) == sorted(set(listed)), f"{problem.folder}: a test is listed twice"
    assert set(listed) == tests, (f"{problem.folder}/README.md: listed but not a test: "
                                  f"{sorted(set(listed) - tests)}; a test not listed: {sorted(tests - set(listed))}")


def test_the_chinese_statement_mirrors_the_english_one(problem):
    problems = statements.out_of_sync(problem)
    assert not problems, f"{problem.folder}/README.zh.md:\n  " + "\n  ".join(problems)
    assert problem.title_zh, f"problem {problem.number} has no title_zh"
