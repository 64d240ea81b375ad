"""``python -m kit.launch N``: the reference run for real under ``torchrun --standalone --nproc-per-node 2``
(the default) on gloo, its table checked against what the workload must communicate; SLURM's variables
mapped to torchrun's arguments; a problem without a workload refused in one line."""
import os
import subprocess
import sys

import pytest

import harness
from kit import catalogue
from kit.launch import __main__ as launch, mlp, slurm
from tests.judge_helpers import ROOT

PARAMETERS = sum(a * b + b for a, b in zip(mlp.WIDTHS, mlp.WIDTHS[1:]))   # the MLP's, all float32
WORLD = 2


def _launch(*args) -> dict:
    """Run the command; its table as {row label: [step ms, sent B, exposed ms, peak MiB]}."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KIT_"))}
    out = subprocess.run([sys.executable, "-m", "kit.launch", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["step", "ms", "sent", "B", "exposed", "ms",
                                                                         "peak", "MiB"])
    assert f"{WORLD} ranks on 1 node(s), gloo on cpu" in out.stdout, out.stdout
    rows = {}
    for line in lines[header + 1:]:
        if line.strip():
            label, *cells = line.rsplit(None, 4)
            rows[label.strip()] = cells
    return rows


def test_ddp_buckets_beside_torch_ddp_under_torchrun():
    rows = _launch("113", "--solution", "--steps", "3")
    assert list(rows) == ["yours  BucketedDDP", "torch  DistributedDataParallel", "yours / torch"], rows
    for label in ("yours  BucketedDDP", "torch  DistributedDataParallel"):
        step_ms, sent, exposed_ms, peak_mib = rows[label]
        # each step all-reduces every gradient once, in buckets: the bytes handed to all_reduce are the parameters'
        assert int(sent) == 4 * PARAMETERS, (label, rows[label])
        assert float(step_ms) > 0 and float(exposed_ms) >= 0 and float(peak_mib) > 0, (label, rows[label])
        assert float(exposed_ms) <= float(step_ms), (label, rows[label])
    assert rows["yours / torch"][1] == "1.00x" and all(cell.endswith("x") for cell in rows["yours / torch"])


def test_zero_stages_beside_zero_redundancy_optimizer_under_torchrun():
    rows = _launch("115", "--solution", "--steps", "3")
    assert list(rows) == ["yours  ShardedOptimizer stage=1", "yours  ShardedOptimizer stage=2",
                          "torch  ZeroRedundancyOptimizer + DDP", "stage 1 / torch", "stage 2 / torch"], rows
    shard = -(-PARAMETERS // WORLD)   # S = ceil(P / N) elements
    # stage 1: all_reduce(P) then all_gather(S); stage 2: reduce_scatter(N*S) then all_gather(S)
    assert int(rows["yours  ShardedOptimizer stage=1"][1]) == 4 * (PARAMETERS + shard), rows
    assert int(rows["yours  ShardedOptimizer stage=2"][1]) == 4 * (WORLD * shard + shard), rows
    # DDP all-reduces every gradient, then each rank broadcasts the parameters it owns (whole ones)
    assert 4 * PARAMETERS < int(rows["torch  ZeroRedundancyOptimizer + DDP"][1]) <= 8 * PARAMETERS, rows


def test_a_problem_without_a_workload_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stopped:
        launch.plan(["112"], env={})
    assert stopped.value.code == launch.EXIT_USAGE
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and "problem 112" in message, message
    assert "kit.launch runs problems 111, 113, 114, 115, 116, 118, 122, 130" in message, message


def test_the_default_launch_is_standalone_and_torchrun_arguments_pass_through():
    _, cmd = launch.plan(["113", "--solution", "--steps", "3"], env={})
    reference = catalogue.load()[113].solution_file()
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                       "-m", "kit.launch.worker", "113", reference, "--steps", "3", "--backend", "gloo"]
    _, cmd = launch.plan(["113", "--nnodes", "2", "--rdzv-endpoint", "h:29500", "--", "--nproc-per-node", "4"],
                         env=SLURM_GPU_NODE)
    assert cmd[3:cmd.index("kit.launch.worker") - 1] == ["--nnodes", "2", "--rdzv-endpoint", "h:29500",
                                                         "--nproc-per-node", "4"]   # SLURM's only without any


SLURM_GPU_NODE = {"SLURM_JOB_NODELIST": "gpu[07-09,12],cpu3", "SLURM_NNODES": "4", "SLURM_NODEID": "2",
                  "SLURM_GPUS_ON_NODE": "8", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_ID": "4242"}


def test_slurm_variables_become_torchrun_arguments():
    assert slurm.torchrun_args({}) is None and slurm.torchrun_args({"SLURM_JOB_ID": "1"}) is None
    assert slurm.torchrun_args(SLURM_GPU_NODE) == [
        "--nnodes", "4", "--node-rank", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "gpu07:29500", "--rdzv-id", "4242"]
    cpu_nodes = {"SLURM_JOB_NODELIST": "node1,node2", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
                 "SLURM_NTASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "7", "MASTER_PORT": "6000"}
    args = slurm.torchrun_args(cpu_nodes)
    assert args[args.index("--nproc-per-node") + 1] == "2" and args[args.index("--rdzv-endpoint") + 1] == "node1:6000"
    # scontrol's expansion, when there is one, names the host
    args = slurm.torchrun_args(cpu_nodes, hostnames=lambda nodelist: ["n-a", "n-b"])
    assert args[args.index("--rdzv-endpoint") + 1] == "n-a:6000"
    assert [slurm.first_host(s) for s in ("a", "a,b", "a[1-3]", "gpu[007,9]", "x-[10-11,20]y,z", "r[2-3]-n[05-06]")] == \
        ["a", "a", "a1", "gpu007", "x-10y", "r2-n05"]
    _, cmd = launch.plan(["113", "--solution"], env=SLURM_GPU_NODE)
    assert cmd[3:cmd.index("kit.launch.worker") - 1] == slurm.torchrun_args(SLURM_GPU_NODE)


def _record_inside_a_rank():
    with harness.recording():
        pass


def test_recording_is_refused_inside_the_harness_ranks():
    with pytest.raises(harness.RankError, match="recording.. is for a process the harness did not start"):
        harness.run(_record_inside_a_rank, 1)
