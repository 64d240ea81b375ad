"""judge.py from the outside: what a learner and an instructor see, and its exit codes."""
import json
import os

from tests.judge_helpers import ROOT, judge  # noqa: F401  (fixture)


def test_no_arguments_lists_every_problem_and_suggests_one(judge):
    out = judge()
    assert out.returncode == 0, out.stderr
    for n in range(111, 121):
        assert str(n) in out.stdout
    assert "DDP 的梯度分桶与通信时间线" in out.stdout
    assert "not started" in out.stdout and "next:" in out.stdout


def test_unknown_problem_lists_the_valid_ones(judge):
    out = judge(999)
    assert out.returncode == 4
    assert "no problem '999'" in out.stderr and "111, 112, 113" in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_target_files_are_usage_errors_in_plain_words(judge, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def make_buckets(:\n")
    partial = tmp_path / "partial.py"
    partial.write_text("def make_buckets(sizes, cap):\n    return []\n")
    for args, message in [(["--target", tmp_path / "missing.py"], "target file not found"),
                          (["--target", broken], "syntax error in"),
                          (["--target", partial], "does not define comm_timeline, exposed_comm, BucketedDDP")]:
        out = judge(113, *args)
        assert out.returncode == 4, out.stdout + out.stderr
        assert message in out.stderr and "Traceback" not in out.stderr


def test_stub_scores_zero_and_says_not_implemented(judge):
    out = judge(113, "--profile", "quick", "--seed", 1)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "not implemented yet: practice/113_ddp_buckets/ddp_buckets.py:" in out.stdout
    assert "score: 0/14" in out.stdout and "Traceback" not in out.stdout


def test_reference_scores_full_marks_in_every_format(judge, tmp_path):
    out = judge(113, "--solution", "--profile", "quick", "--seed", 3, "--format", "json")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["score"] == report["max_score"] == 14 and report["passed"]
    results = tmp_path / "results.json"
    out = judge(113, "--solution", "--profile", "quick", "--seed", 3, "-k", "timeline", "--format", "gradescope",
                "--output", results)
    assert out.returncode == 0, out.stdout + out.stderr
    gs = json.loads(results.read_text())
    assert set(gs) >= {"score", "max_score", "tests", "execution_time"}
    assert gs["tests"] and all(set(t) >= {"name", "score", "max_score", "status", "output", "visibility"}
                               for t in gs["tests"])


def test_a_known_wrong_version_fails_with_the_broken_property_and_a_replay_command(judge):
    wrong = os.path.join(ROOT, "solutions/113_ddp_buckets/wrong/sync_allreduce_in_hook.py")
    out = judge(113, "--target", wrong, "--profile", "quick", "--seed", 5)
    assert out.returncode == 1
    assert "synchronous" in out.stdout and "rerun just this case: python judge.py 113 --target" in out.stdout


def test_a_deadlock_fails_in_seconds_with_the_hang_report(judge, tmp_path):
    source = open(os.path.join(ROOT, "solutions/113_ddp_buckets/ddp_buckets.py")).read()
    hanging = tmp_path / "hanging.py"
    hanging.write_text(source.replace(
        "    def finish_gradient_sync(self):\n",
        "    def finish_gradient_sync(self):\n        if dist.get_rank() == 0 and dist.get_world_size() > 1:\n"
        "            dist.barrier()\n"))
    out = judge(113, "--target", hanging, "--profile", "quick", "--seed", 2, "-k", "frozen")
    assert out.returncode == 1
    assert "did not finish within 5 s" in out.stdout and "never issued" in out.stdout
    assert "hanging.py:" in out.stdout and "dist.barrier()" in out.stdout


def test_hidden_tests_folder(judge, tmp_path):
    folder = tmp_path / "hidden" / "113_ddp_buckets"
    folder.mkdir(parents=True)
    (folder / "test_hidden.py").write_text(
        "import harness\n\n"
        "def _buckets(target, sizes, cap):\n    return target.load().make_buckets(sizes, cap)\n\n"
        "def test_cap_of_one_byte(target):\n"
        "    got = harness.run(_buckets, 1, target, [3, 1, 2], 1).values[0]\n"
        "    harness.check(got == [[2], [1], [0]], f'make_buckets([3, 1, 2], 1) returned {got}')\n")
    out = judge(113, "--solution", "--tests", tmp_path / "hidden", "--format", "json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert [t["name"] for t in json.loads(out.stdout)["tests"]] == ["test_cap_of_one_byte"]
    out = judge(113, "--tests", tmp_path / "hidden")
    assert out.returncode == 1 and "not implemented yet" in out.stdout


def test_trace_writes_chrome_events_and_show_draws_the_lanes(judge, tmp_path):
    trace_file = tmp_path / "t.json"
    out = judge(113, "--solution", "--trace", trace_file, "--show", "--seed", 4)
    assert out.returncode == 0, out.stdout + out.stderr
    events = json.loads(trace_file.read_text())["traceEvents"]
    assert any(e.get("name") == "all_reduce" and e.get("ph") == "X" for e in events)
    assert "rank 0 comm" in out.stdout and "exposed" in out.stdout
