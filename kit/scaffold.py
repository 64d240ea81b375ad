"""The house for growth: ``judge.py new`` lays a problem out, ``out_of_sync`` finds what no longer agrees.

A problem lives in five places (rustlings keeps its exercises and solutions mirrored the same way):
its stub, statement and tests in ``practice/<n>_<slug>/``, its reference and known-wrong versions in
``solutions/<n>_<slug>/``, its alternates in ``tests/alternates/<n>_<slug>/``, its entry in
``problems.yaml`` and its row in the README's problem table.  ``new`` writes all of them at once, each a
skeleton in the one format that passes the checks; ``out_of_sync`` lists every way the catalogue, the
tests, the statements and the README disagree (``selfcheck`` and tests/test_scaffold.py run it).
"""
from __future__ import annotations

import os
import re

from . import catalogue, statements
from .config import ROOT
from .judging import test_names_in

# The top-level READMEs' problem tables, one per language: (file, header, one problem's row)
_TABLES = {
    "README.md": ("| # | problem | difficulty | topic |\n|---|---|---|---|\n",
                  lambda p: f"| {p.number} | [{p.title}](practice/{p.folder}/README.md) | {p.difficulty} | {p.topic} |\n"),
    "README.zh.md": ("| # | 题目 |\n|---|---|\n",
                     lambda p: f"| {p.number} | [{p.title_in('zh')}](practice/{p.folder}/README.zh.md) |\n"),
}
_TABLE_END = "\n\n"


def readme_table(problems: dict, readme: str = "README.md") -> str:
    """A top-level README's problem table, row by row from the catalogue."""
    header, row = _TABLES[readme]
    return header + "".join(row(problems[n]) for n in sorted(problems))


def _table_in(text: str, readme: str = "README.md") -> str:
    start = text.find(_TABLES[readme][0])
    return "" if start < 0 else text[start:text.index(_TABLE_END, start) + 1]


def out_of_sync(problems: dict, root: str = ROOT, only=None) -> list:
    """One line for each disagreement between the catalogue and the files it names; [] when all agree.
    ``only``: these problems' entries (numbers), and not the README's table of them all."""
    found = []
    for p in (problems[n] for n in sorted(only or problems)):
        tests = test_names_in(p.tests_dir(os.path.join(root, "practice")))
        for key, names in (("points", list(p.points)), ("show", [p.show]), ("trace_test", [p.trace_test])):
            for name in names:
                if name and name not in tests:
                    found.append(f"problem {p.number}: {key} names {name}, which is no test of "
                                 f"practice/{p.folder}/")
        try:
            listed = statements.property_names(statements.read(p, "en", root), "en")
        except OSError:
            listed = None
            found.append(f"problem {p.number}: practice/{p.folder}/README.md is missing")
        if listed is not None and set(listed) != tests:
            found.append(f"problem {p.number}: the statement's property list names {sorted(set(listed) - tests)} "
                         f"that are no tests, and not the tests {sorted(tests - set(listed))}")
        if not p.cost:
            found.append(f"problem {p.number}: no cost model (its entry's cost: each figure's closed form, as the "
                         "statement's concept section derives it)")
        elif listed is not None:
            concept = statements.section(statements.read(p, "en", root), statements.SECTIONS["en"][2])
            for figure, formula in p.cost.items():
                if figure not in concept or formula not in concept:
                    found.append(f"problem {p.number}: its cost figure {figure!r} = {formula!r} is not derived in "
                                 "its statement's concept section (the same name and closed form)")
        if not p.wrong_files(root):
            found.append(f"problem {p.number}: no known-wrong version in solutions/{p.folder}/wrong/")
    for readme in _TABLES if only is None else ():
        with open(os.path.join(root, readme), encoding="utf-8") as f:
            if _table_in(f.read(), readme) != readme_table(problems, readme):
                found.append(f"{readme}: the problem table is not the catalogue's (python judge.py new rewrites "
                             "it; kit.scaffold.readme_table gives it)")
    return found


# ---- judge.py new -----------------------------------------------------------------------------------

class ScaffoldError(Exception):
    """A problem that cannot be laid out here; the message says why."""


def new(number: int, slug: str, root: str = ROOT, title: str = "", topic: str = "model parallel") -> list:
    """Lay out problem ``number`` (folder ``<number>_<slug>``): every file it needs, as skeletons in the one
    format, its catalogue entry and its README row.  Returns the paths written, relative to ``root``."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", slug):
        raise ScaffoldError(f"slug {slug!r}: lower-case letters, digits and underscores, starting with a letter")
    problems = catalogue.load(os.path.join(root, "problems.yaml"))
    if number in problems:
        raise ScaffoldError(f"problem {number} exists already: practice/{problems[number].folder}/")
    folder, name = f"{number}_{slug}", slug
    title = title or slug.replace("_", " ").capitalize()
    files = {
        f"practice/{folder}/{name}.py": _STUB.format(number=number, title=title, name=name),
        f"practice/{folder}/README.md": _README.format(number=number, title=title, name=name),
        f"practice/{folder}/README.zh.md": _README_ZH.format(number=number, title=title, name=name),
        f"practice/{folder}/test_{name}.py": _TESTS.format(number=number, name=name),
        f"solutions/{folder}/{name}.py": _REFERENCE.format(number=number, title=title, name=name),
        f"solutions/{folder}/wrong/forgets_the_all_reduce.py": _WRONG.format(name=name),
    }
    for path in files:
        if os.path.exists(os.path.join(root, path)):
            raise ScaffoldError(f"{path} exists already")
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w", encoding="utf-8") as f:
            f.write(text)
    os.makedirs(os.path.join(root, "tests", "alternates", folder), exist_ok=True)
    with open(os.path.join(root, "problems.yaml"), "a", encoding="utf-8") as f:
        f.write(_ENTRY.format(number=number, slug=slug, title=title, topic=topic, name=name))
    problems = catalogue.load(os.path.join(root, "problems.yaml"))
    for readme in _TABLES:
        path = os.path.join(root, readme)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(_table_in(text, readme), readme_table(problems, readme)) if _table_in(text, readme)
                    else text)
    return sorted(files) + ["problems.yaml", *_TABLES, f"tests/alternates/{folder}/"]


_STUB = '''"""Problem {number}: {title}.

Read README.md in this folder first.  Run ``python judge.py {number}``.
"""
from __future__ import annotations

import torch


def {name}(x: torch.Tensor, group=None) -> torch.Tensor:
    """The sum of ``x`` over the ranks of ``group`` (None: the default group), on every rank.  (The skeleton's
    contract: replace it with the problem's.)"""
    raise NotImplementedError("{name}: see README.md, 'The contract'")
'''

_REFERENCE = '''"""Problem {number}: {title} -- the reference."""
from __future__ import annotations

import torch
import torch.distributed as dist


def {name}(x: torch.Tensor, group=None) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out, group=group)
    return out
'''

_WRONG = '''"""Returns this rank's own tensor: it never communicates."""
REJECTED_BY = "test_matches_the_sum_over_ranks"


def {name}(x, group=None):
    return x.clone()
'''

_TESTS = '''"""Problem {number} properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``), each receiving only its own input
(``harness.per_rank``); expected values come from single-process PyTorch here.
"""
import torch
import torch.distributed as dist
from hypothesis import given, strategies as st

import harness
from testkit import strategies as hs


def _call(target, x):
    return target.load().{name}(x)


@given(hs.world_sizes(), st.integers(1, 8), hs.seeds())
def test_matches_the_sum_over_ranks(target, world_size, numel, seed):
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(numel, dtype=torch.float64, generator=gen) for _ in range(world_size)]
    result = harness.run(_call, world_size, target, harness.per_rank(inputs))
    for rank, got in enumerate(result.values):
        harness.assert_close(got, sum(inputs), "{name}(x) against the sum of every rank's x", rank=rank)
'''

_README = '''# {number} · {title}

What the technique is and why it matters, in a paragraph.

You edit `{name}.py` in this folder.

## The contract
`{name}(x, group=None)` returns the sum of `x` over the ranks of `group`, on every rank.

## A worked example
On 2 ranks with `x = [1., 2.]` and `x = [3., 4.]`, both return `[4., 6.]`.

## The concept
The formulas, and the cost model: total bytes per rank, bytes on the busiest link, message count.

**The cost model** (the catalogue's `cost`, in the table after each judge run). One all-reduce of `x`:
* messages per rank: `1`.

## Properties the tests check
* `test_matches_the_sum_over_ranks`: on 1–4 ranks, `x` of 1 to 8 float64 elements: every rank returns the
  sum over ranks, to rounding.

## Run it

```
python judge.py {number}            # judge your file
python judge.py {number} --hint     # the next hint, one at a time
```

## Hints

Stuck? `python judge.py {number} --hint` shows the hints one at a time.
'''

_README_ZH = '''# {number} · {title}

用一段话说明这项技术是什么、为什么重要。

你要编辑本文件夹中的 `{name}.py`。

## 契约
`{name}(x, group=None)` 在每个秩上返回 `group` 中各秩 `x` 的和。

## 示例
在 2 个秩上，`x = [1., 2.]` 与 `x = [3., 4.]`，两个秩都返回 `[4., 6.]`。

## 概念
公式与代价模型：每个秩的总字节数、最忙链路上的字节数、消息数。

**代价模型**（目录中的 `cost`，每次评测后在代价表中列出）。对 `x` 做一次全归约：
* 每个秩的消息数（messages per rank）：`1`。

## 测试检查的性质
* `test_matches_the_sum_over_ranks`：在 1–4 个秩上，`x` 为 1 到 8 个 float64 元素：每个秩返回各秩之和，误差在舍入以内。

## 运行

```
python judge.py {number}            # judge your file
python judge.py {number} --hint     # the next hint, one at a time
```

## 提示

卡住了？`python judge.py {number} --hint` 会一条一条地给出提示。
'''

_ENTRY = '''  - number: {number}
    slug: {slug}
    title: {title}
    title_zh: {title}
    difficulty: medium
    topic: {topic}
    file: {name}.py
    names: [{name}]
    cost:
      messages per rank: "1"
    points:
      test_matches_the_sum_over_ranks: 1
    hints:
      - "One collective does it."
    hints_zh:
      - "一次集合通信就够了。"
'''
