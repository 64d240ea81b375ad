"""The README's instructor recipes, copied out of the README and run as written, in a fresh copy of the kit."""
import json
import os
import re
import shutil
import subprocess
import sys

from tests.judge_helpers import BUGGY_MAKE_BUCKETS, ROOT, fresh_kit, with_make_buckets

REFERENCE = os.path.join(ROOT, "solutions/113_ddp_buckets/ddp_buckets.py")


def readme_block(marker: str) -> str:
    """The README's code block that contains ``marker``, exactly as written."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = [b for b in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S) if marker in b]
    assert len(blocks) == 1, f"{len(blocks)} README blocks contain {marker!r}"
    return blocks[0]


def _env(kit, **extra):
    """As a shell has it: this Python first on PATH, no KIT_* overrides but the state folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    env.update(PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""), NO_COLOR="1",
               KIT_STATE_DIR=str(kit / ".kit"), **extra)
    return env


def test_the_instructor_recipe_for_a_hidden_test_set_says_the_set_is_valid(tmp_path):
    """#24: the README's own hidden test, run as the README says, gave "2 of 13 checks as expected": every
    known-wrong version was a SURPRISE, since the test it names is not in the hidden set."""
    kit = fresh_kit(tmp_path / "kit")
    shutil.copy(REFERENCE, kit / "alice.py")   # the recipe's last line judges alice.py
    recipe = readme_block("mkdir -p hidden/113_ddp_buckets")
    out = subprocess.run(["bash", "-e", "-c", recipe], cwd=kit, env=_env(kit), capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the test set in hidden/ is valid" in out.stdout and "SURPRISE" not in out.stdout, out.stdout
    assert re.search(r"wrong:\w+\s+info\s+info: ", out.stdout), out.stdout
    assert "score: 1/1" in out.stdout


def test_the_gradescope_autograder_as_written_scores_a_correct_a_wrong_and_a_missing_submission(tmp_path):
    """#30: hidden tests were "visible"; --tests replaced the public tests; a missing submission gave rc 4 and no
    results.json; the README's run_autograder put a comment above its shebang."""
    script = readme_block("# run_autograder")
    assert script.startswith("#!/usr/bin/env bash\n")
    setup = readme_block("# setup.sh")
    assert setup.startswith("#!/usr/bin/env bash\n")
    root = tmp_path / "autograder"
    kit = fresh_kit(root / "kit")
    hidden = kit / "hidden" / "113_ddp_buckets"
    hidden.mkdir(parents=True)
    (hidden / "test_hidden.py").write_text(
        "import harness\n\n"
        "def _buckets(target, sizes, cap):\n    return target.load().make_buckets(sizes, cap)\n\n"
        "def test_cap_of_one_byte(target):\n"
        "    got = harness.run(_buckets, 1, target, [3, 1, 2], 1).values[0]\n"
        "    harness.check(got == [[2], [1], [0]], f'make_buckets([3, 1, 2], 1) returned {got}')\n")
    os.symlink(sys.prefix, root / "venv")   # the virtual environment setup.sh makes: this one
    run_autograder = root / "run_autograder"
    run_autograder.write_text(script.replace("/autograder", str(root)))
    run_autograder.chmod(0o755)
    public = {"test_bucket_contract", "test_timeline"}
    results = {}
    for name, source in (("correct", open(REFERENCE).read()), ("wrong", with_make_buckets(BUGGY_MAKE_BUCKETS)),
                         ("missing", None)):
        shutil.rmtree(root / "submission", ignore_errors=True)
        shutil.rmtree(root / "results", ignore_errors=True)
        (root / "submission").mkdir()
        (root / "results").mkdir()
        if source is None:
            (root / "submission" / "DDP-buckets (1).py").write_text("misnamed")
        else:
            (root / "submission" / "ddp_buckets.py").write_text(source)
        # quick: fewer examples, the same tests (the script passes no --profile, so KIT_PROFILE decides)
        out = subprocess.run([str(run_autograder)], env=_env(kit, KIT_PROFILE="quick"), capture_output=True,
                             text=True, timeout=900)
        assert (root / "results" / "results.json").is_file(), out.stdout + out.stderr
        results[name] = json.loads((root / "results" / "results.json").read_text())
    correct, wrong, missing = results["correct"], results["wrong"], results["missing"]
    visibility = {t["name"]: t["visibility"] for t in correct["tests"]}
    assert visibility["test_cap_of_one_byte"] == "after_published"
    assert public <= set(visibility) and {visibility[n] for n in public} == {"visible"}, visibility
    assert correct["score"] == correct["max_score"] > 0
    assert 0 < wrong["score"] < wrong["max_score"] == correct["max_score"]
    assert missing["score"] == 0 and missing["max_score"] == correct["max_score"]
    assert "No submission: there is no ddp_buckets.py in what was submitted (DDP-buckets (1).py)" \
        in missing["output"], missing["output"]
    assert all(t["status"] == "failed" and "ddp_buckets.py" in t["output"] for t in missing["tests"])
    assert str(root) not in json.dumps(results)
