"""GPU mode, as far as a machine without a GPU can show it: the backend choice, the device audit of every
problem's rank code, the world-size filter the GPU check uses, and the GPU check's own report."""
import json
import subprocess
import sys

import pytest
import torch

import harness
from tests.judge_helpers import ROOT, hidden_tests, judge  # noqa: F401  (fixture)


def _made_on_the_rank_device():
    return torch.ones(3, device=harness.device()) * 2


def _made_without_a_device():
    return torch.ones(3) * 2


def _mixes_in_a_tensor_made_without_a_device(x):
    return x + torch.arange(3)


def test_the_device_audit_catches_tensors_made_without_harness_device():
    with harness.defaults(audit_devices=True):
        assert [v.tolist() for v in harness.run(_made_on_the_rank_device, 2).values] == [[2.0] * 3] * 2
        with pytest.raises(harness.RankError, match="on device meta, made without naming a device"):
            harness.run(_made_without_a_device, 2)
        with pytest.raises(harness.RankError, match="meta"):
            harness.run(_mixes_in_a_tensor_made_without_a_device, 2, torch.zeros(3))
    assert harness.run(_made_without_a_device, 1).values[0].tolist() == [2.0] * 3   # no audit: torch's default


def test_selfcheck_runs_the_reference_under_the_device_audit_when_asked(judge, tmp_path):
    """tests/test_selfcheck.py runs every problem's selfcheck with --device-audit: its reference, and the rank
    code of its tests, keep their tensors on harness.device(). Here a hidden test whose rank code makes a
    tensor without naming a device passes a plain selfcheck and fails the audited one, on the reference only."""
    hidden = hidden_tests(tmp_path,
        "import torch\nimport harness\n\n"
        "def _buckets(target, sizes, cap):\n"
        "    return target.load().make_buckets(sizes, cap), torch.tensor(sizes) * 1\n\n"
        "def test_bucket_cap_of_one_byte(target):\n"
        "    got, _ = harness.run(_buckets, 1, target, [3, 1, 2], 1).values[0]\n"
        "    harness.check(got == [[2], [1], [0]], f'make_buckets([3, 1, 2], 1) returned {got}')\n")
    plain = judge("selfcheck", 113, "--tests", hidden, "--format", "json")
    audited = judge("selfcheck", 113, "--tests", hidden, "--format", "json", "--device-audit")
    before = {r["target"]: r for r in json.loads(plain.stdout)}
    rows = {r["target"]: r for r in json.loads(audited.stdout)}
    assert before["reference"]["ok"] and not rows["reference"]["ok"], plain.stdout + audited.stdout
    assert "device meta, made without naming a device" in rows["reference"]["detail"], rows["reference"]
    assert rows["stub"]["ok"]


def test_nccl_without_a_gpu_per_rank_is_a_usage_error(judge):
    if harness.gpu_count() >= 4:
        pytest.skip("this machine has a GPU per rank")
    out = judge(113, "--solution", "--backend", "nccl")
    assert out.returncode == 4, out.stdout + out.stderr
    assert f"this machine has {harness.gpu_count()} GPU" in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(harness.BackendUnavailable, match="NCCL needs one GPU per rank: a world of 4 ranks"):
        harness.pick_backend(4, "nccl")
    assert harness.pick_backend(harness.gpu_count() + 1, "auto") == "gloo"


def test_world_sizes_left_out_skip_the_call():
    with harness.defaults(world_sizes=(2,)):
        assert harness.run(_made_on_the_rank_device, 2).values
        with pytest.raises(harness.WorldSkipped, match="a world of 3 ranks is left out"):
            harness.run(_made_on_the_rank_device, 3)


def test_the_gpu_check_says_what_it_could_not_run():
    if harness.gpu_count():
        pytest.skip("this machine has a GPU: run python -m kit.gpucheck by hand")
    done = subprocess.run([sys.executable, "-m", "kit.gpucheck"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No GPU here, so NCCL cannot run: nothing was run." in done.stdout
    assert "113 ddp_buckets" in done.stdout and "not run: needs 4 GPUs" in done.stdout
