"""The learner's loop (progress, hints, watch, reset) and the instructor's (selfcheck, grade)."""
from __future__ import annotations

import ast
import csv
import json
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from .catalogue import ROOT, Problem
from .judging import UsageError, judge_once

STATE_DIR = os.environ.get("KIT_STATE_DIR", os.path.join(ROOT, ".kit"))


# ---- progress and hints ------------------------------------------------------------------------

def _state_path() -> str:
    return os.path.join(STATE_DIR, "progress.json")


def load_state() -> dict:
    try:
        with open(_state_path(), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"problems": {}, "hints": {}}


def save_state(state: dict):
    os.makedirs(STATE_DIR, exist_ok=True)
    tmp = _state_path() + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, _state_path())


def record_result(problem: Problem, score: float, max_score: float, passed: bool):
    state = load_state()
    state.setdefault("problems", {})[str(problem.number)] = {
        "score": score, "max_score": max_score, "passed": passed, "when": time.time()}
    save_state(state)


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


def next_hint(problem: Problem) -> tuple[int, str | None]:
    """Reveal one more hint each call; returns (index from 1, text) or (shown, None) when none are left."""
    state = load_state()
    shown = state.setdefault("hints", {}).get(str(problem.number), 0)
    if shown >= len(problem.hints):
        return shown, None
    state["hints"][str(problem.number)] = shown + 1
    save_state(state)
    return shown + 1, problem.hints[shown]


# ---- reset -------------------------------------------------------------------------------------

def is_stub(source: str, names) -> bool:
    """Every public function raises NotImplementedError, and every public class has such a method."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False

    def raises_nie(fn) -> bool:
        return any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n) for n in ast.walk(fn))

    found = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for name in names:
        node = found.get(name)
        if isinstance(node, ast.FunctionDef) and not raises_nie(node):
            return False
        if isinstance(node, ast.ClassDef) and not any(
                isinstance(m, ast.FunctionDef) and raises_nie(m) for m in node.body):
            return False
    return any(isinstance(n, ast.Raise) for n in ast.walk(tree))


def pristine_stub(problem: Problem) -> str:
    """The newest committed version of the practice file that is still a stub."""
    rel = f"practice/{problem.folder}/{problem.file}"
    try:
        commits = subprocess.run(["git", "log", "--format=%H", "--", rel], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        raise UsageError("--reset needs the kit's git history, and this checkout has none") from None
    for commit in commits:
        source = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True,
                                text=True).stdout
        if is_stub(source, problem.names):
            return source
    raise UsageError(f"no committed stub of {rel} was found in git history")


def reset(problem: Problem, ask=input) -> str:
    """Restore the stub after ``ask(question)`` answers yes.  No answer to read (stdin closed or
    not a terminal, ``EOFError``) is a UsageError that says to add --yes; the file is left alone."""
    path = problem.practice_file()
    stub = pristine_stub(problem)
    with open(path, encoding="utf-8") as f:
        current = f.read()
    if current == stub:
        return f"{_rel(path)} is already the stub; nothing to do."
    try:
        answer = ask(f"Restore {_rel(path)} to the stub? Your version is backed up first. [y/N] ")
    except EOFError:
        raise UsageError(f"--reset asks before it overwrites {_rel(path)}, and there is no answer to read "
                         "(no terminal). Your file is unchanged. To restore the stub without asking, add --yes: "
                         f"python judge.py {problem.number} --reset --yes") from None
    if answer.strip().lower() not in ("y", "yes"):
        return "Left your file as it is."
    backup_dir = os.path.join(STATE_DIR, "backups", problem.folder)
    os.makedirs(backup_dir, exist_ok=True)
    stem, ext = os.path.splitext(problem.file)
    backup = os.path.join(backup_dir, f"{stem}.{time.strftime('%Y%m%d-%H%M%S')}{ext}")
    with open(backup, "w", encoding="utf-8") as f:
        f.write(current)
    with open(path, "w", encoding="utf-8") as f:
        f.write(stub)
    return f"Restored the stub. Your version is saved as {_rel(backup)}"


def _rel(path: str) -> str:
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith("..") else rel


# ---- watch -------------------------------------------------------------------------------------

def watch(path: str, on_change, poll: float = 0.5, max_runs: int | None = None):
    """Call ``on_change()`` now and after every save of ``path`` (mtime or size changes)."""
    def stamp():
        try:
            st = os.stat(path)
            return st.st_mtime_ns, st.st_size
        except OSError:
            return None
    last, runs = None, 0
    while max_runs is None or runs < max_runs:
        current = stamp()
        if current != last:
            last = current
            on_change()
            runs += 1
            continue
        time.sleep(poll)


# ---- selfcheck ---------------------------------------------------------------------------------

def rejected_by(wrong_file: str) -> str | None:
    """The REJECTED_BY name a known-wrong version declares (read with ast: its code never runs here)."""
    with open(wrong_file, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "REJECTED_BY" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def stub_for_selfcheck(problem: Problem, folder: str) -> tuple[str | None, str]:
    """(path of the stub to check, written into ``folder``; where it came from), or (None, why not).

    The practice file while it is still a stub (an author's edit of the stub counts); once a
    learner has implemented part of it, the newest committed stub from git.
    """
    with open(problem.practice_file(), encoding="utf-8") as f:
        source, origin = f.read(), "working tree"
    if not is_stub(source, problem.names):
        try:
            source, origin = pristine_stub(problem), "git"
        except UsageError:
            return None, (f"not checked: practice/{problem.folder}/{problem.file} is edited, and there is no "
                          "git history to take the stub from")
    path = os.path.join(folder, problem.file)
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    return path, origin


def selfcheck_problem(problem: Problem, tests_root: str | None = None, profile: str = "quick",
                      seed: int | None = 0, progress=None) -> list[dict]:
    """One row per target: the reference must pass, the stub score 0 cleanly, each wrong version fail.

    "The stub" is the pristine one (from git), never the learner's edited practice file.
    All targets run in one test process (``--kit-targets``), sharing its warm ranks.
    """
    import tempfile
    with tempfile.TemporaryDirectory(prefix="kit-selfcheck-") as tmp:
        stub_path, stub_origin = stub_for_selfcheck(problem, tmp)
        targets = [{"id": "reference", "path": problem.solution_file()}]
        if stub_path:
            targets.append({"id": "stub", "path": stub_path})
        expected = {}
        for wrong in problem.wrong_files():
            name = "wrong:" + os.path.splitext(os.path.basename(wrong))[0]
            targets.append({"id": name, "path": wrong})
            expected[name] = rejected_by(wrong)
        verdict = judge_once(problem, "", tests_root=tests_root, profile=profile, seed=seed, targets=targets,
                             no_shrink=True, progress=progress)
    rows = []
    if not stub_path:
        rows.append({"problem": problem.number, "target": "stub", "ok": True, "skipped": True,
                     "detail": stub_origin, "path": f"practice/{problem.folder}/{problem.file}"})
    for t in targets:
        mine = [r for r in verdict.tests if r.target == t["id"]]
        failed = [r for r in mine if not r.passed]
        if t["id"] == "reference":
            ok = bool(mine) and not failed
            detail = "all pass" if ok else f"fails {', '.join(r.name for r in failed)}: {first_line(failed[0].message)}"
        elif t["id"] == "stub":
            unclean = [r for r in failed if r.kind != "not implemented"]
            ok = bool(mine) and len(failed) == len(mine) and not unclean
            passing = [r.name for r in mine if r.passed]
            detail = "scores 0, 'not implemented yet'" if ok else (
                f"{len(passing)} tests pass on the committed stub: {', '.join(passing)}" if passing
                else f"{unclean[0].name} fails with {unclean[0].kind}: {first_line(unclean[0].message)}")
        else:
            want = expected[t["id"]]
            hit = [r for r in failed if r.name.split("[")[0] == want] if want else failed
            ok = bool(hit) and all(r.message for r in hit)
            detail = (f"rejected by {want}: {first_line(hit[0].message)}" if ok
                      else f"NOT rejected by {want or 'any test'}" + ("" if want else " (no REJECTED_BY)"))
        path = f"practice/{problem.folder}/{problem.file} ({stub_origin})" if t["id"] == "stub" else _rel(t["path"])
        rows.append({"problem": problem.number, "target": t["id"], "ok": ok, "detail": detail, "path": path})
    return rows


def first_line(text: str) -> str:
    """The first line of a message, whole: details are never cut mid-word."""
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


# ---- grade -------------------------------------------------------------------------------------

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


def grade_one(problem: Problem, student: str, path: str, profile: str, seed: int, tests_root, timeout: float) -> dict:
    """Judge one submission in its own judge.py process: whatever it does costs only that student."""
    cmd = [sys.executable, os.path.join(ROOT, "judge.py"), str(problem.number), "--target", path,
           "--format", "json", "--profile", profile, "--seed", str(seed)]
    if tests_root:
        cmd += ["--tests", tests_root]
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"student": student, "file": path, "status": "timeout", "score": 0.0, "tests": [],
                "error": f"judging took longer than {timeout:g} s", "elapsed": time.perf_counter() - started}
    try:
        data = json.loads(done.stdout)
        status = "ok"
    except ValueError:
        data = {"score": 0.0, "tests": []}
        status = "error"
    return {"student": student, "file": path, "status": status, "score": data.get("score", 0.0),
            "max_score": data.get("max_score"), "tests": data.get("tests", []),
            "error": "" if status == "ok" else _last_lines(done.stdout + done.stderr),
            "elapsed": time.perf_counter() - started}


def _last_lines(text: str, count: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-count:])


def grade(problem: Problem, folder: str, out_csv: str, profile: str = "default", seed: int = 0,
          tests_root=None, jobs: int | None = None, timeout: float = 600, progress=None) -> list[dict]:
    submissions = find_submissions(folder, problem)
    jobs = jobs or max(1, os.cpu_count() or 1)
    results = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(grade_one, problem, s, p, profile, seed, tests_root, timeout) for s, p in submissions]
        for future in futures:
            results.append(future.result())
            if progress:
                progress(results[-1])
    # A submission judged no test (a timeout, a judge that died) is still out of the class's maximum.
    class_max = max((r["max_score"] for r in results if r.get("max_score")), default=None)
    for r in results:
        if not r.get("max_score"):
            r["max_score"] = class_max
    write_gradebook(results, out_csv, run={"problem": problem.number, "seed": seed, "profile": profile,
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
