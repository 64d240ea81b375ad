"""The judge speaks English or Chinese (--lang, KIT_LANG, the locale), from one catalogue of messages.

Numbers, names and commands stay as they are in both; English output is what it was.
"""
import io
import re

import pytest

from kit import catalogue, messages, report, statements
from kit import judging
from tests.judge_helpers import judge  # noqa: F401  (fixture)

PROBLEMS = catalogue.load()
CJK = re.compile(r"[\u4e00-\u9fff]")


def test_every_message_is_in_every_language_with_the_same_fields():
    for message_id, texts in messages.MESSAGES.items():
        assert set(texts) == set(messages.LANGS), f"{message_id}: texts in {sorted(texts)}, not {messages.LANGS}"
        fields = {lang: messages.fields_of(text) for lang, text in texts.items()}
        assert len({frozenset(f) for f in fields.values()}) == 1, f"{message_id} names other fields: {fields}"
        assert not CJK.search(texts["en"]) and CJK.search(texts["zh"]) or message_id == "list.col.number", message_id


def test_every_catalogue_word_the_list_shows_has_its_messages():
    for p in PROBLEMS.values():
        for message_id in (f"topic.{p.topic}", f"difficulty.{p.difficulty}"):
            assert message_id in messages.MESSAGES, f"problem {p.number}: no message {message_id}"
        assert CJK.search(p.title_zh), f"problem {p.number} has no Chinese title"
        assert len(p.hints_zh) == len(p.hints), f"problem {p.number}: {len(p.hints_zh)} Chinese hints of {len(p.hints)}"


def _failed_verdict(problem, test_name: str) -> judging.Verdict:
    failed = judging.TestResult(name=test_name, outcome="failed", points=0, max_points=2, duration=0.5, kind="property",
                        message="rank 1: expected 3, got 4", example="world_size=3")
    passed = judging.TestResult(name="test_other", outcome="passed", points=1, max_points=1, duration=0.1)
    return judging.Verdict(problem, problem.practice_file(), [failed, passed], seed=7, elapsed=1.5,
                   protections={"sealed": True, "landlock": "ABI 7"})


def _rendered(verdict, lang) -> str:
    out = io.StringIO()
    report.render_text(verdict, ["--target", "mine.py"], out=out, lang=lang)
    return out.getvalue()


@pytest.mark.parametrize("number", sorted(PROBLEMS))
def test_a_failure_of_each_problem_is_explained_in_chinese(number):
    """The failing property of one known-wrong version of each problem, said in Chinese: the Chinese statement's
    words for it; the message, the case and the rerun command as they are."""
    problem = PROBLEMS[number]
    wrong = problem.wrong_files()[0]
    rejected_by = re.search(r'^REJECTED_BY = "(test_\w+)"', open(wrong).read(), re.M).group(1)
    verdict = _failed_verdict(problem, rejected_by)
    explained = statements.property_text(problem, rejected_by, "zh")
    assert CJK.search(explained), f"{problem.folder}/README.zh.md says nothing of {rejected_by}"
    text = _rendered(verdict, "zh")
    for expected in (problem.title_zh, "得分：1/3", "性质：" + explained[:40], "rank 1: expected 3, got 4",
                     "失败的用例：world_size=3", f"python judge.py {number} --target mine.py -k {rejected_by} --seed 7"):
        assert expected in " ".join(text.split()), f"{expected!r} not in:\n{text}"
    gradescope = report.as_gradescope(verdict, lang="zh")
    assert gradescope["output"].startswith(f"第 {number} 题：{problem.title_zh}")
    assert gradescope["tests"][0]["output"].startswith("性质：")


def test_english_reports_are_as_they_were():
    verdict = _failed_verdict(PROBLEMS[113], "test_bucket_contract")
    text = _rendered(verdict, "en")
    assert not CJK.search(text), text
    for expected in ("113 · DDP gradient buckets", "target: ", "score: 1/3   (1.5 s)", "✗ test_bucket_contract\n",
                     "  rank 1: expected 3, got 4\n", "  failing case: world_size=3\n",
                     "  rerun just this case: python judge.py 113 --target mine.py -k test_bucket_contract"):
        assert expected in text, f"{expected!r} not in:\n{text}"
    assert "property:" not in text
    assert report.as_gradescope(verdict)["tests"][0]["output"] == "rank 1: expected 3, got 4\n\nfailing case: world_size=3"


@pytest.mark.parametrize("how", [["--lang", "zh"], "KIT_LANG", "LANG"])
def test_the_problem_list_in_chinese(judge, how):
    env = {"KIT_LANG": "zh"} if how == "KIT_LANG" else {"LANG": "zh_CN.UTF-8", "KIT_LANG": ""} if how == "LANG" else {}
    out = judge(*(how if isinstance(how, list) else []), env=env)
    assert out.returncode == 0, out.stderr
    for p in PROBLEMS.values():
        assert f"{p.number}  {p.title_zh}" in out.stdout
    assert "题目" in out.stdout and "下一步" in out.stdout and "not started" not in out.stdout


def test_usage_errors_in_chinese(judge):
    out = judge(999, "--lang", "zh")
    assert out.returncode == 4 and out.stderr.startswith("错误：没有题目 '999'。") and "Traceback" not in out.stderr
    out = judge(113, "--target", "/no/such.py", "--lang", "zh")
    assert out.returncode == 4 and "错误：找不到目标文件：/no/such.py" in out.stderr


def test_a_wrong_solution_judged_in_chinese(judge):
    """judge.py 113 --lang zh on a known-wrong version: a Chinese report, the failing property in Chinese."""
    problem = PROBLEMS[113]
    wrong = next(f for f in problem.wrong_files() if 'REJECTED_BY = "test_bucket_contract"' in open(f).read())
    out = judge(113, "--target", wrong, "-k", "test_bucket_contract", "--profile", "quick", "--lang", "zh")
    assert out.returncode == 1, out.stderr
    text = " ".join(out.stdout.split())
    assert "得分：0/" in text and "性质：" + statements.property_text(problem, "test_bucket_contract", "zh")[:30] in text
    assert "只重跑这个用例：python judge.py 113 --target" in text
