"""The learner's progress: the score of each problem's last full run, and which hints were shown.

Kept in ``<state_dir>/progress.json`` (``KitConfig.state_dir``: .kit/ unless KIT_STATE_DIR says otherwise).
"""
from __future__ import annotations

import json
import os
import time

from .catalogue import Problem


class Progress:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, "progress.json")

    def load(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return {"problems": {}, "hints": {}}

    def save(self, state: dict):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, self.path)

    def record_result(self, problem: Problem, score: float, max_score: float, passed: bool):
        state = self.load()
        state.setdefault("problems", {})[str(problem.number)] = {
            "score": score, "max_score": max_score, "passed": passed, "when": time.time()}
        self.save(state)

    def next_hint(self, problem: Problem) -> tuple[int, str | None]:
        """Reveal one more hint each call; returns (index from 1, text) or (shown, None) when none are left."""
        state = self.load()
        shown = state.setdefault("hints", {}).get(str(problem.number), 0)
        if shown >= len(problem.hints):
            return shown, None
        state["hints"][str(problem.number)] = shown + 1
        self.save(state)
        return shown + 1, problem.hints[shown]


def status_of(problem: Problem, state: dict) -> str:
    entry = state.get("problems", {}).get(str(problem.number))
    if entry is None:
        return "not started"
    return "passed" if entry["passed"] else f"failing ({entry['score']:g}/{entry['max_score']:g})"


def next_problem(problems: dict, state: dict) -> Problem | None:
    """The problem being worked on (judged last and not yet passing), else the first not passed."""
    entries = state.get("problems", {})
    in_progress = [n for n in problems if str(n) in entries and not entries[str(n)].get("passed")]
    if in_progress:
        return problems[max(in_progress, key=lambda n: entries[str(n)].get("when", 0))]
    for number in sorted(problems):
        if status_of(problems[number], state) != "passed":
            return problems[number]
    return None
