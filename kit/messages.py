"""Every sentence the judge says to a person, by message id, in each language it speaks: one source of truth.

``speaker(lang)`` gives ``say(id, **fields)``.  Numbers, names, paths and commands are fields, so they stay
the same in every language; only the words around them change.  A message without a text in some
language, or whose texts name different fields, fails tests/test_messages.py: nothing falls back to
English unseen.  ``Message`` carries an id and its fields to where the language is known (a usage error
raised deep in the command line's checks is said in ``main``).
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field

LANGS = ("en", "zh")

MESSAGES = {
    # ---- the report of one judged file
    "report.run": {
        "en": "target: {target}   profile: {profile}   seed: {seed}   backend: {backend}",
        "zh": "目标：{target}   配置：{profile}   种子：{seed}   后端：{backend}"},
    "report.col.test": {"en": "test", "zh": "测试"},
    "report.col.points": {"en": "points", "zh": "得分"},
    "report.col.result": {"en": "result", "zh": "结果"},
    "report.col.time": {"en": "time", "zh": "用时"},
    "report.pass": {"en": "pass", "zh": "通过"},
    "report.fail": {"en": "fail", "zh": "失败"},
    # the kind of a failure (the result column, and beside a failure's name)
    "kind.property": {"en": "property", "zh": "性质不成立"},
    "kind.hang": {"en": "hang", "zh": "挂起"},
    "kind.crash": {"en": "crash", "zh": "崩溃"},
    "kind.wrong type": {"en": "wrong type", "zh": "类型错误"},
    "kind.tampered": {"en": "tampered", "zh": "篡改"},
    "kind.load error": {"en": "load error", "zh": "加载错误"},
    "kind.not implemented": {"en": "not implemented", "zh": "尚未实现"},
    "kind.error": {"en": "error", "zh": "异常"},
    "kind.memory": {"en": "memory", "zh": "内存超限"},
    "kind.internal error": {"en": "internal error", "zh": "内部错误"},
    "report.score": {"en": "score: {score}/{max_score}   ({seconds} s)", "zh": "得分：{score}/{max_score}   （{seconds} 秒）"},
    "report.property": {"en": "property: {text}", "zh": "性质：{text}"},
    "report.case": {"en": "failing case: {case}", "zh": "失败的用例：{case}"},
    "report.rerun": {"en": "rerun just this case: {command}", "zh": "只重跑这个用例：{command}"},
    "report.more_lines": {"en": "… {count} more lines: run the command below", "zh": "… 还有 {count} 行：运行下面的命令"},
    "report.no_message": {"en": "(no message)", "zh": "（没有消息）"},
    "report.load_error": {
        "en": "cannot load the file under test ({which} scores 0: load error)",
        "zh": "无法加载被测文件（{which} 计 0 分：加载错误）"},
    "report.every_test": {"en": "every test", "zh": "每个测试"},
    "report.some_tests": {"en": "{count} tests", "zh": "{count} 个测试"},
    "report.not_implemented": {"en": "✗ not implemented yet: {where}: {tests}", "zh": "✗ 尚未实现：{where}：{tests}"},
    "report.and_more": {"en": "{first} and {count} more tests", "zh": "{first} 等另外 {count} 个测试"},
    "report.selected_hold": {
        "en": "The properties matching -k {select} hold. All of them: {command}",
        "zh": "匹配 -k {select} 的性质都成立。运行全部：{command}"},
    "report.all_hold": {
        "en": "All properties hold. What is next: python judge.py (every problem and your status)",
        "zh": "所有性质都成立。下一步：python judge.py（列出每道题和你的进度）"},
    "report.hypothesis": {"en": "hypothesis says:", "zh": "hypothesis 的输出："},
    "report.problem": {"en": "Problem {number}: {title}", "zh": "第 {number} 题：{title}"},
    # ---- the cost table (testkit.cost)
    "cost.title": {"en": "cost of {test} ({case})", "zh": "代价：{test}（{case}）"},
    "cost.col.figure": {"en": "figure", "zh": "指标"},
    "cost.col.formula": {"en": "closed form", "zh": "闭式"},
    "cost.col.model": {"en": "model", "zh": "模型"},
    "cost.col.yours": {"en": "yours", "zh": "你的"},
    "cost.col.ratio": {"en": "ratio", "zh": "比值"},
    # ---- what confined the ranks
    "protections.unknown": {"en": "protections: unknown (no rank started)", "zh": "保护：未知（没有秩启动）"},
    "protections.sealed": {"en": "protections: sealed ({shown})", "zh": "保护：已封闭（{shown}）"},
    "protections.unsealed": {"en": "protections: NOT SEALED: {missing}", "zh": "保护：未封闭：{missing}"},
    # ---- the problem list
    "list.col.number": {"en": "#", "zh": "#"},
    "list.col.problem": {"en": "problem", "zh": "题目"},
    "list.col.difficulty": {"en": "difficulty", "zh": "难度"},
    "list.col.topic": {"en": "topic", "zh": "主题"},
    "list.col.status": {"en": "status", "zh": "状态"},
    "list.all_pass": {
        "en": "Every problem passes. Try --profile thorough, or grade yourself on hidden tests.",
        "zh": "每道题都通过了。试试 --profile thorough，或者用隐藏测试给自己评分。"},
    "list.next": {
        "en": "next: read practice/{folder}/{readme}, then run: python judge.py {number}",
        "zh": "下一步：阅读 practice/{folder}/{readme}，然后运行：python judge.py {number}"},
    "status.not started": {"en": "not started", "zh": "未开始"},
    "status.passed": {"en": "passed", "zh": "已通过"},
    "status.failing": {"en": "failing ({score})", "zh": "未通过（{score}）"},
    "topic.collectives": {"en": "collectives", "zh": "集合通信"},
    "topic.data parallel": {"en": "data parallel", "zh": "数据并行"},
    "topic.sharding (ZeRO)": {"en": "sharding (ZeRO)", "zh": "分片（ZeRO）"},
    "topic.model parallel": {"en": "model parallel", "zh": "模型并行"},
    "topic.long context": {"en": "long context", "zh": "长上下文"},
    "topic.mixture of experts": {"en": "mixture of experts", "zh": "混合专家"},
    "topic.fault tolerance": {"en": "fault tolerance", "zh": "容错"},
    "topic.memory": {"en": "memory", "zh": "显存与内存"},
    "difficulty.easy": {"en": "easy", "zh": "简单"},
    "difficulty.medium": {"en": "medium", "zh": "中等"},
    "difficulty.hard": {"en": "hard", "zh": "困难"},
    # ---- hints
    "hint": {"en": "Hint {index}/{count} for {number}: {text}", "zh": "第 {number} 题的提示 {index}/{count}：{text}"},
    "hint.none_left": {
        "en": "No more hints for {number}: you have seen all {count}. The statement is practice/{folder}/{readme}.",
        "zh": "第 {number} 题没有更多提示了：{count} 条你都看过了。题面在 practice/{folder}/{readme}。"},
    # ---- usage errors (exit code 4)
    "usage.error": {"en": "error: {message}", "zh": "错误：{message}"},
    "usage.no_problem": {
        "en": "no problem {text!r}. Valid problems: {valid}. Run 'python judge.py' to list them.",
        "zh": "没有题目 {text!r}。可选的题目：{valid}。运行 'python judge.py' 查看列表。"},
    "usage.unexpected": {"en": "unexpected arguments: {args}", "zh": "多余的参数：{args}"},
    "usage.no_folder": {"en": "{option} {path}: the folder {folder} does not exist",
                        "zh": "{option} {path}：文件夹 {folder} 不存在"},
    "usage.is_folder": {"en": "{option} {path} is a folder: name a file to write",
                        "zh": "{option} {path} 是一个文件夹：请给出要写入的文件"},
    "usage.target_folder": {"en": "--target names a folder, not a file: {target}{more}",
                            "zh": "--target 给出的是文件夹，不是文件：{target}{more}"},
    "usage.did_you_mean": {"en": " (did you mean {inside}?)", "zh": "（你是想用 {inside} 吗？）"},
    "usage.file_is": {"en": " (problem {number}'s file is {file})", "zh": "（第 {number} 题的文件是 {file}）"},
    "usage.target_missing": {"en": "target file not found: {target}", "zh": "找不到目标文件：{target}"},
    "usage.tests_missing": {"en": "{option}: folder not found: {folder}", "zh": "{option}：找不到文件夹：{folder}"},
    "usage.no_tests": {"en": "no tests matched in {folder}{select}", "zh": "在 {folder} 中没有匹配的测试{select}"},
    "usage.for_select": {"en": " for -k {select!r}", "zh": "（按 -k {select!r} 筛选）"},
    "usage.interrupted": {"en": "interrupted", "zh": "已中断"},
}


@dataclass(frozen=True)
class Message:
    """A message not yet said: its id and fields.  ``str()`` says it in English."""

    id: str
    fields: dict = field(default_factory=dict)

    def say(self, lang: str) -> str:
        return say(lang, self.id, **self.fields)

    def __str__(self):
        return self.say("en")


def say(lang: str, message_id: str, **fields) -> str:
    return MESSAGES[message_id][lang].format(**fields)


def speaker(lang: str):
    """``say(id, **fields)`` in ``lang``."""
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}: choose one of {', '.join(LANGS)}")
    return lambda message_id, **fields: say(lang, message_id, **fields)


def fields_of(text: str) -> set:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}
