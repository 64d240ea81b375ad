"""grade: judge a folder of submissions, one test process each, into a gradebook (CSV and JSON).

Which entries of the folder are submissions (``find_submissions``), for a problem whose file is F:
    <student>.py            a file whose name ends in .py, in any case (Wu.PY is student Wu)
    <student>/              a folder: the one .py file in it named F (in any case), else its only .py file,
                            at any depth (an unzipped upload often nests a folder)
Anything else is skipped and listed with why: not a .py file, a folder with no .py file or with several
and none named F, a second entry for a student already found.

Every student gets a row and a status that says what happened (``STATUSES``).  A Ctrl-C or SIGTERM
starts nothing new, ends the running judges, and writes what there is, the unfinished students marked.
The judges run here, in threads (``LocalJudges``), or as tasks on a Ray cluster (``kit.ray_grade``).
"""
from __future__ import annotations

import contextlib
import csv
import functools
import json
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from .catalogue import Problem
from .config import KitConfig
from .judging import InternalError, JudgeStopped, JudgeTimeout, UsageError, judge_once, run_pytest
from .report import LOAD_ERROR, as_json
from .selfcheck import first_line

# A student's status, most serious first among those a judged run can have (after "load error")
STATUSES = {
    "scored": "judged: the score is what the tests gave (failed properties included)",
    LOAD_ERROR: "the file could not be loaded (a syntax error, a missing name, an exception at import): 0",
    "memory": "a rank used more memory than its limit",
    "crash": "a rank died (a signal, os._exit, an abort inside gloo)",
    "hang": "a call did not finish within its time limit (a deadlock, an endless loop)",
    "tampered": "the submission interfered with the harness's record of communication",
    "timeout": "the whole judge took longer than --timeout and was stopped: 0",
    "error": "the kit failed to judge it (an internal error): see the reason",
    "lost": "the Ray worker judging it died (its node went down or ran out of memory), on its one retry too: "
            "no score",
    "interrupted": "grade was interrupted (Ctrl-C, SIGTERM) before this student was judged: no score",
}
# a test's kind that becomes the student's status, most serious first
_FROM_KINDS = {"internal error": "error", "memory": "memory", "crash": "crash", "hang": "hang", "tampered": "tampered"}
_IGNORED_IN_FOLDERS = ("__pycache__", "__MACOSX")   # and hidden folders (.git, .ipynb_checkpoints)


@dataclass
class Gradebook:
    results: list = field(default_factory=list)   # one row per student, in the order of find_submissions
    skipped: list = field(default_factory=list)   # [{"entry", "why"}]: what in the folder is not a submission
    interrupted: bool = False


def find_submissions(folder: str, problem: Problem) -> tuple[list[tuple[str, str]], list[dict]]:
    """([(student, file)], [{"entry", "why"}]): the submissions in ``folder`` and what was skipped (module doc)."""
    if os.path.isfile(folder):
        raise UsageError(f"grade takes a folder of submissions, and {folder} is a file. To judge one file: "
                         f"python judge.py {problem.number} --target {folder}")
    if not os.path.isdir(folder):
        raise UsageError(f"submissions folder not found: {folder}")
    found, skipped, students = [], [], {}
    for entry in sorted(os.listdir(folder), key=lambda e: _order(folder, e)):
        path = os.path.join(folder, entry)
        student, file, why = _submission(entry, path, problem.file)
        if file and student.lower() in students:
            why = f"a second submission of {student}: {students[student.lower()]} is the one graded"
        if why:
            skipped.append({"entry": entry + ("/" if os.path.isdir(path) else ""), "why": why})
            continue
        students[student.lower()] = entry
        found.append((student, file))
    if not found:
        raise UsageError(f"no submissions in {folder}: expected <student>.py, or <student>/ holding "
                         f"{problem.file} or one .py file" + "".join(f"\n  skipped {s['entry']}: {s['why']}"
                                                                     for s in skipped))
    return found, skipped


def _order(folder: str, entry: str) -> tuple:
    """By student name, case aside; a student's <student>.py before a <student>/ folder."""
    is_dir = os.path.isdir(os.path.join(folder, entry))
    return (entry if is_dir else os.path.splitext(entry)[0]).lower(), is_dir, entry


def _submission(entry: str, path: str, wanted: str) -> tuple[str, str | None, str | None]:
    """(student, file, None) for a submission; (entry, None, why) for anything else."""
    if os.path.isfile(path):
        stem, ext = os.path.splitext(entry)
        if ext.lower() == ".py" and stem:
            return stem, path, None
        return entry, None, "not a .py file"
    if not os.path.isdir(path):
        return entry, None, "neither a file nor a folder"
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(path) if not _ignored(os.path.relpath(d, path))
                   for f in names if f.lower().endswith(".py"))
    named = [f for f in files if os.path.basename(f).lower() == wanted.lower()]
    if len(named) == 1 or len(files) == 1:
        return entry, (named or files)[0], None
    if not files:
        return entry, None, "a folder with no .py file in it"
    listed = ", ".join(os.path.relpath(f, path) for f in files[:6]) + (", …" if len(files) > 6 else "")
    which = f"{len(named)} of them named {wanted}" if named else f"none named {wanted}"
    return entry, None, f"a folder with {len(files)} .py files, {which}: {listed}"


def _ignored(folder: str) -> bool:
    return any(part in _IGNORED_IN_FOLDERS or part.startswith(".") and part != "." for part in folder.split(os.sep))


def student_status(tests: list) -> tuple[str, str]:
    """(status, reason) of a judged student, from its tests' kinds (see ``STATUSES``)."""
    failed = [t for t in tests if t["outcome"] != "passed"]
    if not tests:
        return "error", "no test ran"
    if all(t.get("kind") == LOAD_ERROR for t in tests):
        return LOAD_ERROR, (failed[0].get("message") or "").strip()
    for kind, status in _FROM_KINDS.items():
        hit = [t for t in failed if t.get("kind") == kind]
        if hit:
            return status, f"{hit[0]['name']}: {first_line(hit[0].get('message') or '')}"
    return "scored", ""


def grade_one(problem: Problem, student: str, path: str, config: KitConfig, seed: int, tests_root, timeout: float,
              *, add_tests=None, select=None, stop: threading.Event | None = None, progress=None,
              shown_as: str | None = None) -> dict:
    """Judge one submission in a test process of its own: whatever it does costs only that student.

    ``shown_as``: the file the row and its messages name, when ``path`` is a copy (on a Ray worker)."""
    started = time.perf_counter()
    shown = shown_as or path
    row = {"student": student, "file": shown, "status": "scored", "score": 0.0, "max_score": None, "tests": [],
           "error": ""}
    if stop is not None and stop.is_set():
        return unjudged_row(student, shown, "interrupted")
    try:
        with _importable(path) as judged:
            verdict = as_json(judge_once(problem, judged, config, tests_root=tests_root, add_tests=add_tests,
                                         seed=seed, select=select, timeout=timeout, progress=progress,
                                         runner=functools.partial(run_pytest, stop=stop)))
        for t in verdict["tests"]:
            t["message"], t["example"] = t["message"].replace(judged, shown), t["example"].replace(judged, shown)
        status, reason = student_status(verdict["tests"])
        row.update(score=verdict["score"], max_score=verdict["max_score"], tests=verdict["tests"], status=status,
                   error=reason)
    except JudgeStopped:
        row.update(status="interrupted", score=None, error=STATUSES["interrupted"])
    except JudgeTimeout:
        row.update(status="timeout", error=f"judging took longer than {timeout:g} s and was stopped")
    except InternalError as e:
        row.update(status="error", error=str(e))
    return {**row, "elapsed": time.perf_counter() - started}


def unjudged_row(student: str, file: str, status: str, reason: str = "") -> dict:
    """The row of a student no judge scored (interrupted, lost with its Ray node): no score, and why."""
    return {"student": student, "file": file, "status": status, "score": None, "max_score": None, "tests": [],
            "error": reason or STATUSES[status], "elapsed": 0.0}


@contextlib.contextmanager
def _importable(path: str):
    """``path``, or a copy named ``<stem>.py`` when its suffix is .py in another case (Wu.PY): Python imports
    only files that end in .py."""
    if path.endswith(".py"):
        yield path
        return
    folder = tempfile.mkdtemp(prefix="kit-grade-")
    try:
        copy = os.path.join(folder, os.path.splitext(os.path.basename(path))[0] + ".py")
        shutil.copyfile(path, copy)
        yield copy
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def grade(problem: Problem, submissions: list, skipped: list, out_csv: str, config: KitConfig, seed: int = 0,
          tests_root=None, add_tests=None, select=None, jobs: int | None = None, timeout: float = 600,
          progress=None, done=None, ray: str | None = None) -> Gradebook:
    """Judge each (student, file) in parallel and write the gradebook, also when interrupted (Ctrl-C, or a
    SIGTERM the caller turns into KeyboardInterrupt): then nothing new starts, the running judges end, and
    the students not judged are rows with status "interrupted".

    ``progress(student, event)``: each judge's progress events; ``done(row)``: each student as it finishes.
    ``ray``: a Ray cluster's address (``kit.ray_grade``): each submission is judged there, one task each.
    """
    if ray and jobs:
        raise UsageError("--jobs and --ray: on Ray, how many judges run at once is what the nodes' CPUs allow "
                         "(each asks for a CPU per rank); leave out --jobs")
    if ray:
        from .ray_grade import RayJudges   # only here: Ray is an optional extra
        judges = RayJudges(ray, problem, config)
    else:
        judges = LocalJudges(jobs or max(1, os.cpu_count() or 1))
    judge = functools.partial(grade_one, problem, config=config, seed=seed, tests_root=tests_root, timeout=timeout,
                              add_tests=add_tests, select=select)
    book = Gradebook(skipped=skipped)
    rows = {}
    try:
        for row in judges.rows(judge, submissions, progress):
            rows[row["student"]] = row
            if done:
                done(row)
    except KeyboardInterrupt:
        book.interrupted = True
        rows = {r["student"]: r for r in judges.stop()} | rows
    finally:
        judges.close()
    book.results = [rows.get(s) or unjudged_row(s, p, "interrupted") for s, p in submissions]
    # A submission judged no test (a timeout, a judge that died) is still out of the class's maximum.
    class_max = max((r["max_score"] for r in book.results if r.get("max_score")), default=None)
    for r in book.results:
        if not r.get("max_score"):
            r["max_score"] = class_max
    write_gradebook(book, out_csv, problem, run={
        "problem": problem.number, "seed": seed, "profile": config.profile, "select": select,
        "tests": tests_root or "practice", "added_tests": add_tests, "when": time.time(),
        "interrupted": book.interrupted})
    return book


class LocalJudges:
    """The judges in threads of this process, ``jobs`` at a time, each with its test process."""

    def __init__(self, jobs: int):
        self.pool, self.stopped, self.futures = ThreadPoolExecutor(max_workers=jobs), threading.Event(), []

    def rows(self, judge, submissions: list, progress=None):
        """Each student's row, as its judge finishes."""
        self.futures = [self.pool.submit(judge, s, p, stop=self.stopped,
                                         progress=functools.partial(progress, s) if progress else None)
                        for s, p in submissions]
        for future in as_completed(self.futures):
            yield future.result()

    def stop(self) -> list:
        """Start no judge, end the running ones: the rows of every judge that ended, the stopped ones included."""
        self.stopped.set()   # the running judges end their test processes; the queued ones return at once
        self.pool.shutdown(wait=True, cancel_futures=True)
        return [f.result() for f in self.futures if f.done() and not f.cancelled()]

    def close(self):
        self.pool.shutdown(wait=True, cancel_futures=True)


def column_order(problem: Problem, results: list) -> list[str]:
    """The tests, in the statement's order (problems.yaml's ``points:``), then any others as they ran."""
    seen = list(dict.fromkeys(t["name"] for r in results for t in r["tests"]))
    order = {name: i for i, name in enumerate(problem.points)}
    return sorted(seen, key=lambda n: (order.get(n.split("[")[0], len(order)), seen.index(n)))


def write_gradebook(book: Gradebook, out_csv: str, problem: Problem, run: dict | None = None):
    """grades.csv (a column per test) and grades.json (every message, the reasons, what was skipped, the run's
    seed and profile, a summary)."""
    names = column_order(problem, book.results)
    with open(out_csv, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "score", "max_score", "status", *names, "file"])
        for r in book.results:
            scores = {t["name"]: t["score"] for t in r["tests"]}
            judged = r["score"] is not None
            writer.writerow([r["student"], f"{r['score']:g}" if judged else "",
                             f"{r['max_score']:g}" if r.get("max_score") else "", r["status"],
                             *[f"{scores.get(n, 0):g}" if judged else "" for n in names], r["file"]])
    with open(os.path.splitext(out_csv)[0] + ".json", "w", encoding="utf-8") as f:
        json.dump({**(run or {}), "statuses": STATUSES, "results": book.results, "skipped": book.skipped,
                   "summary": common_failures(book.results)}, f, indent=1, ensure_ascii=False)


def common_failures(results: list[dict], top: int = 5) -> list[dict]:
    counts = Counter()
    example = {}
    for r in results:
        for t in r["tests"]:
            if t["outcome"] != "passed" and t.get("kind") != LOAD_ERROR:   # a load error is the student's status
                key = (t["name"], t.get("kind") or "fail")
                counts[key] += 1
                example.setdefault(key, first_line(t.get("message") or ""))
    return [{"test": name, "kind": kind, "students": n, "example": example[(name, kind)]}
            for (name, kind), n in counts.most_common(top)]
