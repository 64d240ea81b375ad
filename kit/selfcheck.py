"""selfcheck: the reference and every alternate (a correct but unusual solution) pass, the committed stub scores 0
cleanly, every known-wrong version is rejected, and every test rejects at least one of them."""
from __future__ import annotations

import ast
import dataclasses
import os

from .channel import scratch
from .catalogue import Problem
from .config import KitConfig
from .judging import UsageError, judge_once
from .report import relative
from .stubs import is_stub, pristine_stub


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


def selfcheck_problem(problem: Problem, config: KitConfig, tests_root: str | None = None, seed: int | None = 0,
                      progress=None, device_audit: bool = False, reference: bool = True) -> list[dict]:
    """One row per target: the reference and each alternate must pass, the stub score 0 cleanly, each wrong
    version fail.

    "The stub" is the pristine one (from git), never the learner's edited practice file.
    All targets run in one test process (``--kit-targets``), sharing its warm ranks; without
    shrinking, since only "it fails" matters here.  ``device_audit``: the reference runs under the
    device audit (see harness.devices), so it must also keep its tensors on ``harness.device()``.
    ``reference`` False: the reference is left out (the practice run, ``pytest --solution``, judges it, under
    the device audit); every test must still be shown able to fail.

    ``tests_root`` (an instructor's test set): what can be checked is checked (the reference passes, the
    stub fails cleanly); the known-wrong versions name the kit's own tests, so each runs on every test of
    the set and its row is information (``info``), never a failure.
    """
    with scratch("selfcheck-") as tmp:
        stub_path, stub_origin = stub_for_selfcheck(problem, tmp)
        targets = [{"id": "reference", "path": problem.solution_file(), "device_audit": device_audit}] \
            if reference else []
        if stub_path:
            targets.append({"id": "stub", "path": stub_path})
        for alternate in problem.alternate_files():
            targets.append({"id": "alternate:" + os.path.splitext(os.path.basename(alternate))[0], "path": alternate})
        expected = {}
        for wrong in problem.wrong_files():
            name = "wrong:" + os.path.splitext(os.path.basename(wrong))[0]
            expected[name] = rejected_by(wrong)
            # what must reject it is all that runs on it (every test, when it names none or the set is not ours)
            chosen = [expected[name]] if expected[name] and tests_root is None else None
            targets.append({"id": name, "path": wrong, "tests": chosen})
        verdict = judge_once(problem, "", dataclasses.replace(config, shrink=False), tests_root=tests_root,
                             seed=seed, targets=targets, progress=progress)
    rows = []
    if not stub_path:
        rows.append({"problem": problem.number, "target": "stub", "ok": True, "skipped": True,
                     "detail": stub_origin, "path": f"practice/{problem.folder}/{problem.file}"})
    for t in targets:
        mine = [r for r in verdict.tests if r.target == t["id"]]
        if t["id"] == "reference" or t["id"].startswith("alternate:"):
            ok, detail = _reference_row(mine)
        elif t["id"] == "stub":
            ok, detail = _stub_row(mine)
        elif tests_root is not None:
            rows.append({"problem": problem.number, "target": t["id"], "ok": True, "info": True,
                         "detail": _wrong_version_info(mine, expected[t["id"]]), "path": relative(t["path"])})
            continue
        else:
            ok, detail = _wrong_version_row(mine, expected[t["id"]])
        path = f"practice/{problem.folder}/{problem.file} ({stub_origin})" if t["id"] == "stub" else relative(t["path"])
        rows.append({"problem": problem.number, "target": t["id"], "ok": ok, "detail": detail, "path": path})
    if tests_root is None:   # the kit's own tests: each must be shown able to fail (hidden tests are the instructor's)
        rows += _unshown_tests(problem, verdict, set(expected.values()))
    return rows


def _unshown_tests(problem: Problem, verdict, named: set) -> list[dict]:
    """A row for each test that no known-wrong version names in REJECTED_BY: nothing shows it can fail.  The
    tests are those the reference, the stub and the alternates ran (each runs every test)."""
    tests = sorted({r.name.split("[")[0] for r in verdict.tests if not (r.target or "").startswith("wrong:")} - named)
    return [{"problem": problem.number, "target": f"test:{name}", "ok": False, "path": f"practice/{problem.folder}",
             "detail": "no known-wrong version names it in REJECTED_BY: nothing shows this test can fail"}
            for name in tests]


def _reference_row(results: list) -> tuple[bool, str]:
    failed = [r for r in results if not r.passed]
    if results and not failed:
        return True, "all pass"
    if not results:
        return False, "ran no test"
    return False, f"fails {', '.join(r.name for r in failed)}: {first_line(failed[0].message)}"


def _stub_row(results: list) -> tuple[bool, str]:
    passing = [r.name for r in results if r.passed]
    unclean = [r for r in results if not r.passed and r.kind != "not implemented"]
    if results and not passing and not unclean:
        return True, "scores 0, 'not implemented yet'"
    if passing:
        return False, f"{len(passing)} tests pass on the committed stub: {', '.join(passing)}"
    if not results:
        return False, "ran no test"
    return False, f"{unclean[0].name} fails with {unclean[0].kind}: {first_line(unclean[0].message)}"


def _wrong_version_row(results: list, want: str | None) -> tuple[bool, str]:
    failed = [r for r in results if not r.passed]
    hit = [r for r in failed if r.name.split("[")[0] == want] if want else failed
    if hit and all(r.message for r in hit):
        return True, f"rejected by {want}: {first_line(hit[0].message)}"
    return False, f"NOT rejected by {want or 'any test'}" + ("" if want else " (no REJECTED_BY)")


def _wrong_version_info(results: list, public_test: str | None) -> str:
    """A known-wrong version on an instructor's test set: which of its tests reject it (information only)."""
    failed = [r for r in results if not r.passed]
    elsewhere = f"; the public {public_test} rejects it" if public_test else ""
    if not failed:
        return f"info: passes every test of this set{elsewhere}"
    return f"info: rejected by {', '.join(r.name for r in failed)}: {first_line(failed[0].message)}"


def first_line(text: str) -> str:
    """The first line of a message, whole: details are never cut mid-word."""
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""
