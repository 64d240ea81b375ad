"""Side channels between ranks are closed (issue 12, part 4).

Without a sandbox a submission can move the real data between ranks through a file in
/dev/shm or /tmp, another rank's folder, /proc, System V shared memory, an abstract Unix
socket or signals, while right-sized decoy sends keep every trace property happy.  Each
test below is one such attack: it must fail on the rank with a PermissionError (reported
as ``harness.RankError``).  The rest check that ordinary distributed code still works.

``rank_main`` confines every rank (``harness.sandbox.confine``) before
``init_process_group``; where it does not (yet), each rank function here confines its own
rank first, and the worlds are shut down afterwards.  Where the kernel has no Landlock,
every test skips with the reason.
"""
import ctypes
import json
import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist

import harness
from harness import sandbox as _sandbox
from harness.sandbox import landlock as _landlock

N = 2
TIMEOUT = 30


# ---- making sure the ranks are confined ---------------------------------------------------------

def _status():
    return _sandbox.STATUS


def _ensure_confined():
    """Confine this rank unless rank_main already did (then this is a no-op)."""
    if _sandbox.STATUS is None:
        world_dir = os.path.dirname(os.readlink("/proc/self/fd/2"))    # <World.dir>/rank<r>.stderr
        _sandbox.confine(os.path.join(world_dir, f"rank{dist.get_rank()}.tmp"),
                         store_file=os.path.join(world_dir, "store"))
    return _sandbox.STATUS


@pytest.fixture(scope="module")
def sandbox():
    """The ranks' sandbox status; skips the test where this machine has none."""
    wired = harness.run(_status, N, timeout=TIMEOUT).values[0] is not None
    statuses = harness.run(_ensure_confined, N, timeout=TIMEOUT).values
    if not all(s.startswith("confined") for s in statuses):
        if not wired:
            harness.shutdown()
        pytest.skip(f"no sandbox on this machine: {statuses[0]}")
    yield {"wired": wired, "status": statuses[0]}
    if not wired:
        harness.shutdown()   # confined by hand: do not hand these ranks to later tests


def _refused(fn, *args, rank=None):
    with pytest.raises(harness.RankError) as info:
        harness.run(fn, N, *args, timeout=TIMEOUT)
    error = info.value
    assert error.exc_type == "PermissionError", f"expected a PermissionError, got: {error}"
    if rank is not None:
        assert error.rank == rank, str(error)
    return error


# ---- the attacks ---------------------------------------------------------------------------------

def _through_a_file(folder):
    _ensure_confined()
    path = os.path.join(folder, f"harness-attack-{os.getppid()}")
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            f.write("the real gradients")
    dist.barrier()
    with open(path) as f:
        return f.read()


def test_a_file_in_dev_shm_cannot_carry_data_between_ranks(sandbox):
    error = _refused(_through_a_file, "/dev/shm", rank=0)
    assert "/dev/shm/harness-attack" in error.exc_message


def test_a_file_in_tmp_cannot_carry_data_between_ranks(sandbox):
    error = _refused(_through_a_file, "/tmp", rank=0)
    assert "/tmp/harness-attack" in error.exc_message


def _into_the_world_folder():
    _ensure_confined()
    world_dir = os.path.dirname(tempfile.gettempdir())    # beside the store and the other ranks' folders
    return _through_a_file(world_dir)


def test_a_file_beside_the_rendezvous_store_cannot_carry_data(sandbox):
    _refused(_into_the_world_folder, rank=0)


def _read_the_other_ranks_folder():
    _ensure_confined()
    mine = os.path.join(tempfile.gettempdir(), "secret")
    with open(mine, "w") as f:                     # its own folder: allowed
        f.write("the real gradients")
    paths = [None] * N
    dist.all_gather_object(paths, mine)            # a few bytes of path instead of the data
    with open(paths[1 - dist.get_rank()]) as f:
        return f.read()


def test_a_rank_cannot_read_another_ranks_private_folder(sandbox):
    error = _refused(_read_the_other_ranks_folder)
    assert "secret" in error.exc_message


def _read_the_other_ranks_proc():
    _ensure_confined()
    with open("/proc/self/comm", "rb") as f:          # its own /proc: allowed
        name = f.read().strip()
    if dist.get_rank() == 0:
        ctypes.CDLL(None).prctl(15, b"gradient=0.25")   # PR_SET_NAME: 15 bytes a call, readable in /proc
    pids = [None] * N
    dist.all_gather_object(pids, os.getpid())
    try:
        if dist.get_rank() == 1:
            with open(f"/proc/{pids[0]}/comm") as f:
                return f.read()
    finally:
        dist.barrier()
        ctypes.CDLL(None).prctl(15, name)


def test_a_rank_cannot_read_another_ranks_proc_entries(sandbox):
    _refused(_read_the_other_ranks_proc, rank=1)


def _sysv_shared_memory():
    _ensure_confined()
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(0x6B17 + os.getppid(), 4096, 0o1600)    # IPC_CREAT | 0600, a key both ranks know
    if shmid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"shmget: {os.strerror(err)}")
    libc.shmctl(shmid, 0, None)                                   # IPC_RMID: leave nothing behind
    return shmid


def test_system_v_shared_memory_is_refused(sandbox):
    _refused(_sysv_shared_memory)


def _abstract_socket():
    _ensure_confined()
    name = f"\0harness-attack-{os.getppid()}"
    server = None
    if dist.get_rank() == 0:
        server = socket.socket(socket.AF_UNIX)
        server.bind(name)
        server.listen()
    dist.barrier()
    try:
        if dist.get_rank() == 1:
            client = socket.socket(socket.AF_UNIX)
            client.connect(name)
            client.sendall(b"the real gradients")
    finally:
        dist.barrier()
        if server is not None:
            server.close()


def test_an_abstract_unix_socket_between_ranks_is_refused(sandbox):
    _refused(_abstract_socket)   # no rank may make a Unix socket at all (seccomp), so none reaches another


def _signal_the_other_rank():
    _ensure_confined()
    pids = [None] * N
    dist.all_gather_object(pids, os.getpid())
    os.kill(pids[1 - dist.get_rank()], 0)     # sigqueue() would carry an int with each signal


def test_a_rank_cannot_signal_another_rank(sandbox):
    if "not scoped" in sandbox["status"]:
        pytest.skip(sandbox["status"])
    _refused(_signal_the_other_rank)


def _write_from_a_gloo_callback():
    _ensure_confined()
    work = dist.all_reduce(torch.ones(1), async_op=True)
    path = f"/dev/shm/harness-attack-callback-{os.getpid()}"

    def leak(fut):
        with open(path, "w") as f:            # runs on a gloo worker thread when the op is still in flight
            f.write("the real gradients")
        return True
    work.get_future().then(leak).wait()


def test_a_gloo_worker_thread_is_confined_too(sandbox):
    if not sandbox["wired"]:
        pytest.skip("needs rank_main to confine before init_process_group: gloo's threads exist by the time "
                    "a rank function could confine its own rank")
    with pytest.raises(harness.RankError) as info:
        harness.run(_write_from_a_gloo_callback, N, timeout=TIMEOUT)
    assert "PermissionError" in str(info.value)


def _store_round_trip():
    _ensure_confined()
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        store.set("harness-attack", "the real gradients")
    dist.barrier()
    return store.get("harness-attack").decode()


def _store_guarded():
    return _sandbox.STORE_GUARDED


def test_the_rendezvous_store_cannot_carry_data(sandbox):
    if not all(harness.run(_store_guarded, N, timeout=TIMEOUT).values):
        pytest.xfail("known gap: the rendezvous store stays reachable (FileStore reopens its file for every "
                     "operation and new_group rendezvouses through it); rank_main can call _sandbox.guard_store()")
    error = _refused(_store_round_trip, rank=0)
    assert "rendezvous store" in error.exc_message


def _guard_then_use_groups():
    _ensure_confined()
    _sandbox.guard_store()
    group = dist.new_group([0, 1])                    # torch's own rendezvous still works (from C++)
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    subgroup, _ = dist.new_subgroups(group_size=1)
    objects = [None] * N
    dist.all_gather_object(objects, dist.get_rank())
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    try:
        dist.distributed_c10d._get_default_store().set("harness-attack", "x")
    except PermissionError as e:
        refused = str(e)
    else:
        refused = None
    return t.item(), objects, refused


def test_guard_store_refuses_rank_code_and_keeps_new_group_working(sandbox):
    try:
        for total, objects, refused in harness.run(_guard_then_use_groups, N, timeout=TIMEOUT).values:
            assert total == 2.0 and objects == [0, 1]
            assert refused and "rendezvous store" in refused, refused
    finally:
        harness.shutdown()    # the Store methods stay patched in these ranks: not for later tests


def _stdout_identity():
    _ensure_confined()
    st = os.fstat(1)
    return (st.st_dev, st.st_ino) if os.path.realpath("/proc/self/fd/1") != "/dev/null" else None


def test_ranks_do_not_share_a_writable_stdout(sandbox):
    if not sandbox["wired"]:
        pytest.skip("rank_main points each rank's stdout at its own file once it confines the ranks")
    ids = [i for i in harness.run(_stdout_identity, N, timeout=TIMEOUT).values if i is not None]
    assert len(set(ids)) == len(ids), "ranks share one stdout file: what one writes, another can read back"


# ---- ordinary code still works -------------------------------------------------------------------

def _collectives_p2p_and_groups():
    _ensure_confined()
    rank = dist.get_rank()
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    gathered = [torch.zeros(1) for _ in range(N)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    b = torch.tensor([float(rank + 7)])
    dist.broadcast(b, 1)
    if rank == 0:
        dist.send(torch.arange(4.0), 1)
        got = None
    else:
        got = torch.zeros(4)
        dist.recv(got, 0)
        got = got.tolist()
    group = dist.new_group([0, 1])                  # rendezvous through the store, after confinement
    g = torch.ones(1)
    dist.all_reduce(g, group=group)
    objects = [None] * N
    dist.all_gather_object(objects, {"rank": rank})
    return t.tolist(), [x.item() for x in gathered], b.item(), got, g.item(), objects


def test_collectives_p2p_and_new_group_work_when_confined(sandbox):
    values = harness.run(_collectives_p2p_and_groups, N, timeout=TIMEOUT).values
    for rank, (reduced, gathered, broadcast, got, grouped, objects) in enumerate(values):
        assert reduced == [1.0] * 3 and gathered == [0.0, 1.0] and broadcast == 8.0 and grouped == 2.0
        assert objects == [{"rank": 0}, {"rank": 1}]
        assert got == (None if rank == 0 else [0.0, 1.0, 2.0, 3.0])


def _ddp_step():
    _ensure_confined()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    torch.manual_seed(dist.get_rank())
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_ddp_and_an_optimizer_step_work_when_confined(sandbox):
    first, second = harness.run(_ddp_step, N, timeout=TIMEOUT).values
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b)      # averaged gradients: the replicas stay identical


def _tempfiles():
    _ensure_confined()
    folder = tempfile.gettempdir()
    fd, name = tempfile.mkstemp()
    os.write(fd, b"scratch")
    os.close(fd)
    with tempfile.TemporaryDirectory() as d, tempfile.NamedTemporaryFile("w+") as f:
        f.write("scratch")
        f.flush()
        inner = os.path.dirname(d)
    with open(name, "rb") as f:
        data = f.read()
    os.unlink(name)
    return folder, os.environ.get("TMPDIR"), os.path.dirname(name), inner, data


def test_tempfile_works_in_each_ranks_private_folder(sandbox):
    values = harness.run(_tempfiles, N, timeout=TIMEOUT).values
    for folder, tmpdir, made_in, inner, data in values:
        assert folder == tmpdir == made_in == inner and data == b"scratch"
    assert len({v[0] for v in values}) == N, "two ranks share a temporary folder"


# ---- the sandbox itself, in the test process -----------------------------------------------------

def test_the_landlock_probe_gives_a_version_or_a_reason():
    abi = _sandbox.landlock_abi()
    assert (isinstance(abi, int) and abi >= 1) or (isinstance(abi, str) and abi), abi


def _confine_in_a_child_without_landlock(folder: str, out: str):
    """A kernel without Landlock (ENOSYS here, by an unknown syscall number), in a forked child: what
    confine reports, and what the child can still do."""
    pid = os.fork()
    if pid == 0:
        try:
            _landlock._SYS = {m: (99999, 99999, 99999) for m in ("x86_64", "aarch64")}
            state = _sandbox.confine(folder)
            try:
                socket.socket(socket.AF_UNIX)
                state["unix socket"] = "made"
            except PermissionError:
                state["unix socket"] = "refused"
            state["tmpdir"] = os.environ["TMPDIR"]
            with open(out, "w") as f:
                json.dump(state, f)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    with open(out) as f:
        return json.load(f)


def test_without_landlock_confine_says_why_and_still_applies_the_seccomp_filter(tmp_path):
    state = _confine_in_a_child_without_landlock(str(tmp_path / "rank0.tmp"), str(tmp_path / "state.json"))
    assert state["landlock"].startswith("unavailable:") and "Landlock" in state["landlock"], state
    assert state["seccomp"] == "on" and state["unix socket"] == "refused", state
    assert state["tmpdir"] == str(tmp_path / "rank0.tmp")   # tempfile still points at the private folder
