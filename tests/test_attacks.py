"""The attack suite: one test per class of cheat a red team used against the verdict, each named after it.

Learner code controls everything inside its rank processes.  A grade rests only on what the ranks cannot
reach: the kernel's own accounting (TCP counters, file system calls, resident memory), processes they
cannot touch (the judge, its test process, the forkserver) and channels they cannot write (the verdict's
pipe).  Each test plays one cheat through the real engine (or the real judge), with Landlock in force and
with Landlock left out as on a kernel without it: the seccomp filter, the ranks' own uids and the file
witness must still hold, and the report must say the run was not sealed.
"""
import glob
import json
import mmap
import os
import socket

import pytest
import torch
import torch.distributed as dist

import harness
from testkit.overlap import check_receives_overlap_compute
from tests.judge_helpers import ROOT, judge  # noqa: F401  (fixture)

LANDLOCK = pytest.mark.parametrize("landlock", [True, False], ids=["landlock", "no-landlock"])


@pytest.fixture
def sandbox(landlock):
    """Every call of the test confined as it says; the worlds are fresh for it and gone after it."""
    harness.shutdown()
    with harness.defaults(landlock=landlock, timeout=30):
        yield landlock
    harness.shutdown()


def refused(fn, *args) -> str:
    """'refused: <why>' when ``fn`` raises OSError, else 'did it'."""
    try:
        fn(*args)
        return "did it"
    except OSError as e:
        return f"refused: {e.strerror}"


# ---- 1. forkserver or broker escape ------------------------------------------------------------------

def reach_an_unconfined_process(marker: str):
    """The red team's route: the forkserver's socket (its path is in /proc/net/unix), which runs whatever a
    client sends it; and the descriptors a rank inherits, which lead to the resource tracker."""
    paths = [line.split()[-1] for line in open("/proc/self/net/unix").read().splitlines()[1:]
             if "pymp-" in line or "listener" in line]
    tried = {"unix socket": refused(socket.socket, socket.AF_UNIX)}
    for path in paths[:3]:
        tried[path] = refused(lambda p: socket.socket(socket.AF_UNIX).connect(p), path)
    for fd in map(int, os.listdir("/proc/self/fd")):
        target = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if target.startswith("pipe:") and fd > 2:   # a pipe this rank did not make: write a command into it
            tried[f"fd {fd}"] = refused(os.write, fd, f"REGISTER:{marker}:shared_memory\n".encode())
    return tried


@LANDLOCK
def test_forkserver_or_broker_escape(sandbox, tmp_path):
    marker = str(tmp_path / "ran-unconfined")
    tried = harness.run(reach_an_unconfined_process, 2, marker).values[0]
    assert tried["unix socket"].startswith("refused"), tried
    assert all(v.startswith("refused") for k, v in tried.items() if k.startswith("/")), tried
    assert not os.path.exists(marker)


# ---- 2. report write ---------------------------------------------------------------------------------

REPORT_FORGER = '''
import json, os
report = {"tests": [{"name": "test_lengths_equal", "outcome": "passed", "points": 99, "duration": 0}],
          "seed": 0, "profile": "quick", "backend": "gloo", "exitstatus": 0}
line = (json.dumps({"event": "report", "report": report}) + "\\n").encode()
for pid in os.listdir("/proc"):                      # every descriptor of every process it can reach
    for fd in (os.listdir(f"/proc/{pid}/fd") if pid.isdigit() and os.access(f"/proc/{pid}/fd", os.R_OK) else []):
        try:
            with open(f"/proc/{pid}/fd/{fd}", "wb") as f:
                f.write(line)
        except OSError:
            pass
for fd in range(3, 64):                              # and every descriptor of its own
    try:
        os.write(fd, line)
    except OSError:
        pass
for path in __import__("glob").glob("/tmp/**/report*.json", recursive=True):
    try:
        open(path, "w").write(json.dumps(report))
    except OSError:
        pass


class ShardSampler:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError
'''


@LANDLOCK
def test_report_write(judge, tmp_path, landlock):
    submission = tmp_path / "sampler.py"
    submission.write_text(REPORT_FORGER)
    out = judge("112", "--target", submission, "--profile", "quick", "--format", "json",
                *([] if landlock else ["--no-landlock"]), timeout=900)
    report = json.loads(out.stdout)
    assert report["score"] == 0 and report["max_score"] == 10, report
    assert report["protections"]["sealed"] is landlock, report["protections"]


# ---- 3. reference read -------------------------------------------------------------------------------

REFERENCE_READER = '''
import os
import harness
ShardSampler = None   # a check of the names the file defines passes: reading the reference is what must fail
here = os.path.dirname(os.path.dirname(os.path.abspath(harness.__file__)))
exec(open(os.path.join(here, "solutions", "112_distributed_sampler", "sampler.py")).read())
'''


@LANDLOCK
def test_reference_read(judge, tmp_path, landlock):
    submission = tmp_path / "sampler.py"
    submission.write_text(REFERENCE_READER)
    out = judge("112", "--target", submission, "--profile", "quick", "--format", "json",
                *([] if landlock else ["--no-landlock"]), timeout=900)
    report = json.loads(out.stdout)
    assert report["score"] == 0, report
    assert all("Permission denied" in t["message"] for t in report["tests"]), report["tests"][0]


# ---- 4. library stand-in -----------------------------------------------------------------------------

@LANDLOCK
@pytest.mark.parametrize("how", ["from torch.utils.data import DistributedSampler as ShardSampler",
                                 "import torch.utils.data as d\nclass ShardSampler(d.DistributedSampler): pass"],
                         ids=["renamed", "subclassed"])
def test_library_stand_in(judge, tmp_path, landlock, how):
    submission = tmp_path / "sampler.py"
    submission.write_text(how + "\n")
    out = judge("112", "--target", submission, "--profile", "quick", "--format", "json",
                *([] if landlock else ["--no-landlock"]), timeout=900)
    report = json.loads(out.stdout)
    assert report["score"] == 0, report
    assert "torch's own implementation" in report["tests"][0]["message"], report["tests"][0]


# ---- 5. numpy, ctypes or mmap memory -----------------------------------------------------------------

MB = 2 ** 20


def keep_state_out_of_tensors(how: str, megabytes: int):
    """Optimizer-sized state kept where a walk of tensors does not look."""
    import ctypes
    import numpy
    size = megabytes * MB
    if how == "numpy":
        dist._hidden_state = numpy.ones(size, dtype=numpy.uint8)
    elif how == "ctypes":
        buffer = ctypes.create_string_buffer(size)
        ctypes.memset(buffer, 1, size)
        dist._hidden_state = buffer
    else:
        dist._hidden_state = mmap.mmap(-1, size)
        dist._hidden_state.write(b"\1" * size)
    return harness.live_tensor_bytes()


@LANDLOCK
@pytest.mark.parametrize("how", ["numpy", "ctypes", "mmap"])
def test_numpy_ctypes_or_mmap_memory(sandbox, how):
    """The tensor walk inside the rank cannot see such state; the test process reads the rank's resident
    memory from /proc, which can."""
    result = harness.run(keep_state_out_of_tensors, 1, how, 64, timeout=60)
    grew = result.memory[0]["end"] - result.memory[0]["start"]
    assert result.values[0] < 64 * MB <= grew + 2 * MB, (result.values[0], grew)


# ---- 6. measurement-only behaviour -------------------------------------------------------------------

def measured() -> bool:
    """What a cheat looks at to tell a measured call: is compute being counted in this call?"""
    from torch.overrides import _get_current_function_mode_stack
    return bool(_get_current_function_mode_stack())


def ring_step_that_fakes_overlap_when_measured():
    """No overlap at all, and a dummy exp between posting and waiting whenever the call looks measured."""
    rank, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (torch.randn(4, 8) for _ in range(3))
    next_k = torch.empty(4, 8)
    with harness.phase("forward"):
        works = [dist.isend(k, (rank + 1) % n), dist.irecv(next_k, (rank - 1) % n)]
        if measured():
            torch.exp(torch.ones(64)).sum()
        for work in works:
            work.wait()
    return torch.softmax(q @ next_k.T, dim=-1) @ v


@LANDLOCK
def test_measurement_only_behaviour(sandbox):
    """A problem's calls are all measured alike (problems.yaml probes), so a cheat that acts only when
    measured acts always; and a dummy op between posting and waiting is not work the result needed."""
    with harness.defaults(probes=[harness.Compute()]):
        for _ in range(3):
            trace = harness.run(ring_step_that_fakes_overlap_when_measured, 2).trace
            with pytest.raises(harness.PropertyFailed, match="no attention compute in between that the result"):
                check_receives_overlap_compute(trace, range(2), "forward", "the ring step", "block")


# ---- 7-9. stream reset, baseline edit, inference-mode op -----------------------------------------------

def hide_an_all_reduce(how: str):
    """An all_reduce the trace must not show: reset the record stream after it (the red team's
    ``{"ev": "call"}`` line), with the tracer's lists cleared and the op counters' baseline moved to match;
    or run it on inference-mode tensors, which skip the tracer's kernels, with or without the baseline."""
    from harness.record.recorder import active
    recorder = active()
    if how == "stream reset":
        dist.all_reduce(torch.ones(1000))
        os.write(recorder.flight_fd, b'{"ev": "call"}\n')
        recorder.ops.clear()
    else:
        with torch.inference_mode():
            dist.all_reduce(torch.ones(1000))
    if how != "inference-mode op":
        for group in recorder.groups.values():
            group["start"] += 1
    return 0


@LANDLOCK
@pytest.mark.parametrize("how", ["stream reset", "baseline edit", "inference-mode op"])
def test_stream_reset_baseline_edit_and_inference_mode_op(sandbox, how):
    with pytest.raises(harness.TraceTampered):
        harness.run(hide_an_all_reduce, 2, how)


# ---- 10. TCP side channel ----------------------------------------------------------------------------

def side_channel_with_decoys():
    """The red team's 121 cheat: data over the ranks' own loopback connection, zero-filled collectives of
    the right shapes for the trace."""
    rank = dist.get_rank()
    listener = socket.create_server(("127.0.0.1", 0)) if rank == 1 else None
    port = torch.tensor([listener.getsockname()[1] if listener else 0])
    dist.all_reduce(port)
    data = torch.arange(1000, dtype=torch.float32)
    if rank == 0:
        socket.create_connection(("127.0.0.1", int(port))).sendall(data.numpy().tobytes())
    else:
        listener.accept()[0].recv(4000)
    dist.all_reduce(torch.zeros(1000))   # the decoy
    return 0


@LANDLOCK
def test_tcp_side_channel(sandbox):
    with pytest.raises(harness.TraceTampered, match="the kernel saw traffic"):
        harness.run(side_channel_with_decoys, 2)


# ---- 11. dir_fd file ops -----------------------------------------------------------------------------

def commit_before_the_parts(folder: str):
    """The red team's 125 cheat: COMMIT written first, through a folder descriptor, so that an audit hook
    on paths never sees it; then the parts."""
    if dist.get_rank() == 0:
        where = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        fd = os.open("COMMIT", os.O_WRONLY | os.O_CREAT, 0o660, dir_fd=where)
        with os.fdopen(fd, "w") as f:
            f.write("part0 part1")
        os.close(where)
    torch.save(torch.ones(3), os.path.join(folder, f"part{dist.get_rank()}"))
    dist.barrier()


@LANDLOCK
def test_dir_fd_file_ops(sandbox):
    shared = harness.SharedFolder()
    result = harness.run(commit_before_the_parts, 2, shared.path,
                         probes=[shared, harness.KillAt(rank=0, event=1)])
    assert result.killed is not None and "COMMIT" in result.killed.event, result.killed
    assert not os.path.exists(os.path.join(shared.path, "COMMIT")), "the kill came after COMMIT was written"


# ---- 12. unconfined run ------------------------------------------------------------------------------

def channels_an_unconfined_rank_would_have(kit_file: str):
    """What a rank with no Landlock could do on main: write a file every rank can read, read the kit's
    own files, and a report's folder."""
    return {"/dev/shm": refused(lambda: open(f"/dev/shm/harness-attack-{os.getppid()}", "w").write("x")),
            "/tmp": refused(lambda: open(f"/tmp/harness-attack-{os.getppid()}", "w").write("x")),
            "the kit's sources": refused(lambda: open(kit_file).read(1))}


@LANDLOCK
def test_unconfined_run(sandbox):
    kit_file = os.path.join(ROOT, "kit", "cli.py")
    with harness.defaults(hidden=(os.path.join(ROOT, "kit"),)):
        reached = harness.run(channels_an_unconfined_rank_would_have, 2, kit_file).values
    for rank, tried in enumerate(reached):
        assert all(v.startswith("refused") for v in tried.values()), (rank, tried)
    state = harness.protections()
    assert state["sealed"] is sandbox and (sandbox or any("landlock" in m for m in state["missing"])), state
    assert not glob.glob("/dev/shm/harness-attack-*") and not glob.glob("/tmp/harness-attack-*")
