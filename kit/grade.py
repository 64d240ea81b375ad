"""grade: judge a folder of submissions, one test process each, into a gradebook (CSV and JSON)."""
from __future__ import annotations

import csv
import json
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from .catalogue import Problem
from .config import KitConfig
from .judging import InternalError, JudgeTimeout, UsageError, judge_once
from .report import as_json
from .selfcheck import first_line


def find_submissions(folder: str, problem: Problem) -> list[tuple[str, str]]:
    """(student, file): ``folder/<student>.py`` or ``folder/<student>/<problem file>``."""
    if not os.path.isdir(folder):
        raise UsageError(f"submissions folder not found: {folder}")
    found = []
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if entry.endswith(".py") and os.path.isfile(path):
            found.append((entry[:-3], path))
        elif os.path.isdir(path) and os.path.isfile(os.path.join(path, problem.file)):
            found.append((entry, os.path.join(path, problem.file)))
    if not found:
        raise UsageError(f"no submissions in {folder}: expected <student>.py or <student>/{problem.file}")
    return found


def grade_one(problem: Problem, student: str, path: str, config: KitConfig, seed: int, tests_root,
              timeout: float) -> dict:
    """Judge one submission in a test process of its own: whatever it does costs only that student."""
    started = time.perf_counter()
    row = {"student": student, "file": path, "status": "ok", "score": 0.0, "max_score": None, "tests": [],
           "error": ""}
    try:
        verdict = as_json(judge_once(problem, path, config, tests_root=tests_root, seed=seed, timeout=timeout))
        row.update(score=verdict["score"], max_score=verdict["max_score"], tests=verdict["tests"])
    except JudgeTimeout:
        row.update(status="timeout", error=f"judging took longer than {timeout:g} s")
    except InternalError as e:
        row.update(status="error", error=str(e))
    return {**row, "elapsed": time.perf_counter() - started}


def grade(problem: Problem, folder: str, out_csv: str, config: KitConfig, seed: int = 0, tests_root=None,
          jobs: int | None = None, timeout: float = 600, progress=None) -> list[dict]:
    submissions = find_submissions(folder, problem)
    jobs = jobs or max(1, os.cpu_count() or 1)
    results = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(grade_one, problem, s, p, config, seed, tests_root, timeout) for s, p in submissions]
        for future in futures:
            results.append(future.result())
            if progress:
                progress(results[-1])
    # A submission judged no test (a timeout, a judge that died) is still out of the class's maximum.
    class_max = max((r["max_score"] for r in results if r.get("max_score")), default=None)
    for r in results:
        if not r.get("max_score"):
            r["max_score"] = class_max
    write_gradebook(results, out_csv, run={"problem": problem.number, "seed": seed, "profile": config.profile,
                                           "tests": tests_root or "practice", "when": time.time()})
    return results


def write_gradebook(results: list[dict], out_csv: str, run: dict | None = None):
    """grades.csv (a column per test) and grades.json (every message, the run's seed and profile, a summary)."""
    test_names = sorted({t["name"] for r in results for t in r["tests"]})
    with open(out_csv, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "score", "max_score", "status", *test_names, "file"])
        for r in results:
            scores = {t["name"]: t["score"] for t in r["tests"]}
            writer.writerow([r["student"], f"{r['score']:g}", f"{r['max_score']:g}" if r.get("max_score") else "",
                             r["status"], *[f"{scores.get(n, 0):g}" for n in test_names], r["file"]])
    with open(os.path.splitext(out_csv)[0] + ".json", "w", encoding="utf-8") as f:
        json.dump({**(run or {}), "results": results, "summary": common_failures(results)}, f, indent=1,
                  ensure_ascii=False)


def common_failures(results: list[dict], top: int = 5) -> list[dict]:
    counts = Counter()
    example = {}
    for r in results:
        for t in r["tests"]:
            if t["outcome"] != "passed":
                key = (t["name"], t.get("kind") or "fail")
                counts[key] += 1
                example.setdefault(key, first_line(t.get("message") or ""))
    return [{"test": name, "kind": kind, "students": n, "example": example[(name, kind)]}
            for (name, kind), n in counts.most_common(top)]
