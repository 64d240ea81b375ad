"""The traffic witness never cries wolf: honest code moves exactly the bytes of gloo's model.

Each call runs between two kernel snapshots of its world's sockets (``harness.probes.traffic``):
every public collective and point-to-point call (the table of tests/test_harness_tamper.py), sync
and async, on the default group and on a subgroup, at world sizes 2 to 4 and 8, odd sizes, dtypes
and tensors past gloo's 1 MiB segments, DDP, FSDP2 and torch.distributed.checkpoint.  The bytes
that crossed between each ordered pair of ranks are what ``_gloo`` gives, to the byte, and
``check`` says nothing.  The attacks are in tests/test_harness_traffic_attacks.py.
"""
import os
import subprocess
import warnings

import pytest
import torch
import torch.distributed as dist

import harness
from harness import pool
from harness.probes import _gloo, _netdiag, traffic
from tests.test_harness_tamper import CONFIGS, NAMES, run_calls


def nothing():
    return None


PREFIX = "the kernel saw traffic between the ranks that the trace does not explain: "


def witnessed(fn, n: int, *args, **kwargs):
    """Run fn on n ranks: (its result, or None; what the traffic witness said of the call, or None).
    Every call runs between two kernel snapshots of its world's sockets (``World.call``)."""
    try:
        return harness.run(fn, n, *args, timeout=60, **kwargs), None
    except harness.TraceTampered as e:
        if not str(e).startswith(PREFIX):
            raise
        return None, str(e)[len(PREFIX):]


# ---- honest code: exactly the bytes of gloo's model ------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS + [(4, False, False), (4, True, True)],
                         ids=lambda c: f"N{c[0]}-{'subgroup' if c[1] else 'world'}-{'async' if c[2] else 'sync'}")
def test_every_call_moves_exactly_the_bytes_of_gloos_model(config):
    n, on_subgroup, async_op = config
    _, problem = witnessed(run_calls, n, NAMES, on_subgroup, async_op)
    if problem is not None:   # say which call it was
        culprits = [name for name in NAMES if witnessed(run_calls, n, [name], on_subgroup, async_op)[1]]
        pytest.fail(f"{problem} (calls: {culprits})")


def sized_collectives(dtypes, sizes):
    """Odd sizes, empty tensors and tensors past gloo's 1 MiB segments; a group of one rank too."""
    warnings.simplefilter("ignore")
    n = dist.get_world_size()
    alone = dist.new_group([0])
    for dtype in map(lambda name: getattr(torch, name), dtypes):
        for numel in sizes:
            t = torch.ones(numel, dtype=dtype)
            dist.all_reduce(t)
            dist.reduce(t, n - 1)
            dist.broadcast(t, n - 1)
            dist.all_gather_into_tensor(torch.empty(numel * n, dtype=dtype), t)
            dist.reduce_scatter_tensor(t, torch.ones(numel * n, dtype=dtype))
            dist.all_to_all_single(torch.empty(numel * n, dtype=dtype), torch.ones(numel * n, dtype=dtype))
            if dist.get_rank() == 0:
                dist.all_reduce(t, group=alone)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_odd_sizes_dtypes_and_segmented_tensors_move_exactly_the_bytes_of_gloos_model(n):
    _, problem = witnessed(sized_collectives, n, ["float32", "float16", "int64", "uint8"], [0, 1, 3, 17])
    assert problem is None
    _, problem = witnessed(sized_collectives, n, ["float32", "bfloat16"], [300_001])   # 1.2 MB: 2+ segments
    assert problem is None


def ring_of_eight():
    for t in (torch.ones(5), torch.ones(70_000)):
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.empty(8 * t.numel()), t)
        dist.broadcast(t, 3)
        dist.all_to_all_single(torch.empty(8 * t.numel()), torch.ones(8 * t.numel()))
    dist.barrier()


def test_a_world_of_eight_moves_exactly_the_bytes_of_gloos_model():
    assert witnessed(ring_of_eight, 8)[1] is None


def train_ddp():
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)), bucket_cap_mb=0.0002)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(3, 8)).sum().backward()
        optimizer.step()


def train_fsdp2():
    warnings.simplefilter("ignore")
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(3, 8)).sum().backward()
        optimizer.step()


def save_and_load_a_checkpoint(path):
    warnings.simplefilter("ignore")
    import torch.distributed.checkpoint as dcp
    dcp.save({"w": torch.ones(10) * dist.get_rank(), "step": 3}, checkpoint_id=path)
    state = {"w": torch.zeros(10), "step": 0}
    dcp.load(state, checkpoint_id=path)
    return state["step"]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("workload", [train_ddp, train_fsdp2], ids=lambda f: f.__name__)
def test_ddp_and_fsdp2_raise_no_false_alarm(workload, n):
    assert witnessed(workload, n)[1] is None


def rooted_collectives(root):
    t = torch.ones(1000)
    dist.broadcast(t, root)
    dist.reduce(t, root)
    dist.gather(t, [torch.empty(1000) for _ in range(3)] if dist.get_rank() == root else None, root)
    dist.scatter(t, [torch.ones(1000) for _ in range(3)] if dist.get_rank() == root else None, root)


@pytest.mark.parametrize("root", [0, 2])
def test_rooted_collectives_are_exact_once_their_records_name_the_root(root):
    """The tracer records each broadcast's, reduce's, gather's and scatter's root (``CommOp.root``), so
    ``_gloo`` knows to the byte what each pair must carry."""
    result, problem = witnessed(rooted_collectives, 3, root)
    assert problem is None and {op.root for op in result.trace.ops()} == {root}
    assert all(low == high for low, high in _gloo.expected(result.trace).values())


@pytest.mark.parametrize("n", [2, 3])
def test_a_dcp_save_and_load_raises_no_false_alarm(n):
    folder = harness.SharedFolder()
    result, problem = witnessed(save_and_load_a_checkpoint, n, os.path.join(folder.path, "ckpt"), probes=[folder])
    assert result.values == [3] * n and problem is None


def test_the_counters_match_what_ss_reports():
    """The offsets in _netdiag are the kernel's: every connection of a world reads as ``ss -tin`` has it."""
    harness.run(nothing, 2, timeout=60)
    ranks = set().union(*(traffic.sockets_of(pid) for pid in pool.live_rank_pids()))   # idle: their counters hold still
    listing = subprocess.run(["ss", "-tinOHe"], capture_output=True, text=True).stdout
    by_inode = {s.inode: s for s in _netdiag.dump() if s.inode in ranks}
    compared = 0
    for line in listing.splitlines():
        fields = dict(f.split(":", 1) for f in line.split() if f.split(":", 1)[0] in
                      ("ino", "bytes_sent", "bytes_received", "bytes_acked", "bytes_retrans"))
        s = by_inode.get(int(fields.get("ino", 0)))
        if s is not None and s.bytes_sent is not None:
            assert [s.bytes_sent, s.bytes_received, s.bytes_acked, s.bytes_retrans] == [
                int(fields.get(k, 0)) for k in ("bytes_sent", "bytes_received", "bytes_acked", "bytes_retrans")], line
            compared += 1
    assert compared >= 2
