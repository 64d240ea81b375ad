"""A problem's statement, README.md and its Chinese mirror README.zh.md: the one format, read and compared.

The sections are fixed (SECTIONS); what must agree between the two languages is what a reader copies or
runs: every code span, every code block, every property name, and the shape of the sections.
"""
from __future__ import annotations

import os
import re
from collections import Counter

from .config import ROOT
from .judging import test_names_in

SECTIONS = {
    "en": ("The contract", "A worked example", "The concept", "Properties the tests check", "Run it", "Hints"),
    "zh": ("契约", "示例", "概念", "测试检查的性质", "运行", "提示"),
}
_FILE = {"en": "README.md", "zh": "README.zh.md"}
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_SPAN = re.compile(r"`([^`\n]+)`")
_WIDE_BREAK = re.compile(r"(?<=[\u3000-\u9fff\uff00-\uffef]) (?=[\u3000-\u9fff\uff00-\uffef])")
_PROPERTY = re.compile(r"^[*-] `(test_\w+)`", re.M)


def path(problem, lang: str, root: str = ROOT) -> str:
    return os.path.join(os.path.dirname(problem.practice_file(root)), _FILE[lang])


def read(problem, lang: str, root: str = ROOT) -> str:
    with open(path(problem, lang, root), encoding="utf-8") as f:
        return f.read()


def _prose(text: str) -> str:
    return _FENCE.sub("", text)


def sections(text: str, lang: str) -> list:
    return re.findall(r"^## (.+?)\s*$", _prose(text), re.M)


def section(text: str, name: str) -> str:
    """The body of one ``##`` section, up to the next."""
    match = re.search(rf"^## {re.escape(name)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return match.group(1) if match else ""


def property_names(text: str, lang: str) -> list:
    return _PROPERTY.findall(section(text, SECTIONS[lang][3]))


def property_text(problem, test_name: str, lang: str) -> str:
    """The statement's words for one property (its bullet in the property list, name aside, as one line)."""
    try:
        body = section(read(problem, lang), SECTIONS[lang][3])
    except OSError:
        return ""
    match = re.search(rf"^[*-] `{re.escape(test_name)}`[:：]?\s*(.*?)(?=^[*-] `test_|^\S|\Z)", body, re.M | re.S)
    if not match:
        return ""
    # one line: a line break between two Chinese characters is no space
    return _WIDE_BREAK.sub("", " ".join(match.group(1).split()))


def test_names(problem) -> set:
    """The top-level test functions of the problem's public test files."""
    return test_names_in(problem.tests_dir())


def out_of_sync(problem) -> list:
    """What README.zh.md lacks or has differently from README.md, one line each; [] when they agree."""
    if not os.path.exists(path(problem, "zh")):
        return ["missing"]
    en, zh = read(problem, "en"), read(problem, "zh")
    found = []
    if sections(zh, "zh") != list(SECTIONS["zh"]):
        found.append(f"its sections must be exactly {list(SECTIONS['zh'])}, not {sections(zh, 'zh')}")
    subsections = [len(re.findall(r"^### ", _prose(t), re.M)) for t in (en, zh)]
    if subsections[0] != subsections[1]:
        found.append(f"{subsections[1]} ### subsections where README.md has {subsections[0]}")
    if Counter(_FENCE.findall(en)) != Counter(_FENCE.findall(zh)):
        found.append("its code blocks differ from README.md's (they are copied, not translated)")
    missing = sorted(set(_SPAN.findall(_prose(en))) - set(_SPAN.findall(_prose(zh))))
    if missing:
        found.append(f"code spans of README.md missing: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if property_names(en, "en") != property_names(zh, "zh"):
        found.append("its property list names other tests, or in another order, than README.md's")
    return found
