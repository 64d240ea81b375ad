"""The traffic witness catches what the trace does not show; each test is named after one attack.

A side channel between ranks beside zero-filled decoys, an op the tracer cannot see, a forged record,
a connection out of the world (held by the rank or by a process it forked), a channel handed to a
process outside the world, a UDP socket, traffic between calls.  What the kernel's destroy notices
add, and ranks told apart by uid, need root: tests/test_harness_traffic_root.py.
"""
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist

import harness
from harness.probes import traffic
from harness.records import build_trace
from harness.trace import CommOp
from tests.test_harness_traffic import nothing, witnessed, world


KEPT = "_traffic_test_sockets"   # where an attack keeps its sockets past the call (torch.distributed's module)


def keep(*sockets):
    setattr(dist, KEPT, getattr(dist, KEPT, []) + list(sockets))


def close_kept():
    for s in getattr(dist, KEPT, []):
        s.close()
    setattr(dist, KEPT, [])


@pytest.fixture
def attack():
    """Each attack keeps its sockets open past its call, so that the snapshot after it sees them; the
    next call closes them."""
    yield
    harness.run(close_kept, 2, timeout=30)


def rank_to_rank_channel():
    """A TCP connection from rank 0 to a listener of rank 1, whose port a traced all_reduce carries."""
    rank = dist.get_rank()
    listener = socket.create_server(("127.0.0.1", 0)) if rank == 1 else None
    port = torch.tensor([listener.getsockname()[1] if listener else 0])
    dist.all_reduce(port)
    if rank == 0:
        channel = socket.create_connection(("127.0.0.1", int(port)))
    else:
        channel, _ = listener.accept()
        keep(listener)
    keep(channel)
    return channel


def receive(connection, nbytes: int) -> bytes:
    received = b""
    while len(received) < nbytes:
        received += connection.recv(1 << 16)
    return received


def zeros_from_rank_0_to_rank_1(nbytes: int):
    """Over the channel an earlier call made (``open_a_channel``)."""
    channel = getattr(dist, KEPT)[-1]
    if dist.get_rank() == 0:
        channel.sendall(bytes(nbytes))
    else:
        receive(channel, nbytes)


def side_channel_with_decoys(numel):
    """The real data goes over the code's own connection; a zero-filled all_reduce of the right shape
    keeps the trace looking right."""
    data, channel = torch.arange(numel, dtype=torch.float32), rank_to_rank_channel()
    if dist.get_rank() == 0:
        channel.sendall(data.numpy().tobytes())
    else:
        data = torch.frombuffer(bytearray(receive(channel, data.nbytes)), dtype=torch.float32)
    dist.all_reduce(torch.zeros(numel))   # the decoy
    return data.sum().item()


def test_a_side_channel_over_tcp_with_zero_filled_decoy_collectives_is_caught(attack):
    result, problem, _ = witnessed(side_channel_with_decoys, 2, 1000)
    assert result.values == [499500.0] * 2
    # 4000 bytes of data, less the 8 a new connection's set-up is allowed
    assert problem is not None and problem.startswith("rank 0 sent rank 1 3992 bytes that no traced op explains")


def open_a_channel():
    rank_to_rank_channel()


def test_a_bare_connection_between_ranks_is_caught(attack):
    """A new connection must start with gloo's sequence number; an idle one of the code's own does not."""
    _, problem, _ = witnessed(open_a_channel, 2)
    assert problem == "rank 0 opened a connection to rank 1 that did not start as a process group's " \
                      "(0 set-up bytes, not 8)"


def one_byte_beside(decoy):
    """One byte over a connection that an earlier call made (so it carries no set-up bytes)."""
    channel = getattr(dist, KEPT)[-1]
    if dist.get_rank() == 1:
        channel.sendall(b"x")
    else:
        channel.recv(1)
    DECOYS[decoy]()


DECOYS = {"all_reduce": lambda: dist.all_reduce(torch.zeros(256)),
          "all_gather": lambda: dist.all_gather_into_tensor(torch.empty(512), torch.zeros(256)),
          "all_to_all": lambda: dist.all_to_all_single(torch.empty(256), torch.zeros(256)),
          "send_recv": lambda: (dist.send(torch.zeros(256), 1) if dist.get_rank() == 0
                                else dist.recv(torch.empty(256), 0)),
          "barrier": dist.barrier}


@pytest.mark.parametrize("decoy", DECOYS)
def test_one_byte_through_a_kept_side_channel_beside_any_collective_is_caught(decoy, attack):
    harness.run(open_a_channel, 2, timeout=30)
    _, problem, _ = witnessed(one_byte_beside, 2, decoy)
    assert problem is not None and problem.startswith("rank 1 sent rank 0 1 bytes that no traced op explains")


def a_reverse_channel_beside_a_broadcast():
    """Rank 0 sends the root 1000 bytes of its own while rank 1 broadcasts 1000 bytes to it."""
    zeros_from_rank_0_to_rank_1(1000)
    dist.broadcast(torch.ones(250), 1)


def test_a_channel_against_a_broadcast_hides_in_an_unnamed_root_and_is_caught_once_the_root_is_named(attack):
    harness.run(open_a_channel, 2, timeout=30)
    result, problem, diff = witnessed(a_reverse_channel_beside_a_broadcast, 2)
    assert problem is None   # root 0 would have sent these 1000 + 96 bytes: the record cannot tell
    for op in result.trace.ops():
        op.root = 1
    assert traffic.check(diff, result.trace) == \
        "rank 0 sent rank 1 1000 bytes that no traced op explains (1048 bytes crossed; the trace accounts for 48)"


def leave_a_thread_sending():
    """A thread that outlives the call sends 500 bytes over a kept channel while no call runs."""
    import threading
    if dist.get_rank() == 0:
        channel = getattr(dist, KEPT)[-1]
        threading.Timer(0.3, channel.sendall, [bytes(500)]).start()


def test_traffic_between_calls_is_checked_with_the_next_call(attack):
    """The witness's end of one call is its beginning of the next: no moment goes unwatched."""
    harness.run(open_a_channel, 2, timeout=30)
    witness = traffic.Witness(traffic.PidOwners([p.pid for p in world(2).procs]))
    verdicts = []
    for fn in (leave_a_thread_sending, nothing, honest_all_reduce):
        witness.begin()
        verdicts.append(witness.end(harness.run(fn, 2, timeout=30).trace))
        time.sleep(0.5)
    assert verdicts[0] is None and verdicts[2] is None, verdicts
    assert verdicts[1] is not None and verdicts[1].startswith("rank 0 sent rank 1 500 bytes that no traced op explains")


def untraced_all_reduce():
    dist.all_reduce(torch.ones(4))
    with torch.inference_mode():   # the tracer cannot see it
        dist.all_reduce(torch.ones(1000))


def test_an_untraced_all_reduce_on_inference_mode_tensors_is_caught(monkeypatch):
    """The ranks' own op counters report it too, and the world is then killed: the second snapshot is
    taken just before, and the trace is what the ranks streamed."""
    w = world(2)
    owners = traffic.PidOwners([p.pid for p in w.procs])
    before, seen = owners.snapshot(), {}
    kill = type(w).kill
    monkeypatch.setattr(type(w), "kill", lambda self: (seen.setdefault("after", owners.snapshot()), kill(self)))
    with pytest.raises(harness.TraceTampered):
        harness.run(untraced_all_reduce, 2, timeout=30)
    trace = build_trace([stream.ops(r)[0] for r, stream in enumerate(w.records)], w.records)
    assert trace.kinds(0) == trace.kinds(1) == ["all_reduce"]
    problem = traffic.check(traffic.difference(before, seen["after"]), trace)
    assert problem is not None and "bytes that no traced op explains" in problem


def honest_all_reduce():
    dist.all_reduce(torch.ones(4))


def test_a_forged_record_of_an_all_reduce_that_never_ran_is_caught():
    result, problem, diff = witnessed(honest_all_reduce, 2)
    assert problem is None
    for ops in result.trace.ops_by_rank:   # as if each rank's tracer had been made to record one more
        ops.append(CommOp(**{**ops[0].__dict__, "index": 1, "shapes": [(1024,)], "in_bytes": 4096,
                             "out_bytes": 4096}))
    problem = traffic.check(diff, result.trace)
    # 592 = 16 bytes + 12 gloo headers of 48; the forged 4096 bytes would need 4096 + 12 * 48 more
    assert problem == "rank 0 sent rank 1 only 592 bytes, but the ops the trace gives it need 5264: " \
                      "a traced op did not run"


def call_home(port):
    """Rank 0 talks to a process outside its world: the test process itself."""
    if dist.get_rank() == 0:
        home = socket.create_connection(("127.0.0.1", port))
        home.sendall(b"the answer")
        keep(home)


def call_home_from_a_helper(port):
    """The same, from a process the rank forks: the rank itself holds no socket."""
    if dist.get_rank() == 0 and os.fork() == 0:
        home = socket.create_connection(("127.0.0.1", port))
        home.recv(1)   # until the test process closes its end
        os._exit(0)


@pytest.mark.parametrize("calls_home", [call_home, call_home_from_a_helper], ids=lambda f: f.__name__)
def test_a_rank_connecting_to_a_listener_in_the_test_process_is_caught(calls_home, attack):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        owners = traffic.PidOwners([p.pid for p in world(2).procs])
        before = owners.snapshot()
        trace = harness.run(calls_home, 2, port, timeout=30).trace
        accepted, _ = listener.accept()   # (the helper has connected once this returns)
        problem = traffic.check(traffic.difference(before, owners.snapshot()), trace)
        accepted.close()
    assert problem is not None
    assert problem.startswith(f"rank 0 holds a TCP connection to a process outside its world (127.0.0.1:{port},")


def hand_the_channel_to_an_orphan():
    """Rank 0's end of a kept channel goes to a grandchild that its parent leaves, so that it is no
    rank's descendant; the rank closes its own copy."""
    if dist.get_rank() == 0:
        channel = getattr(dist, KEPT)[-1]
        child = os.fork()
        if child == 0:
            if os.fork() == 0:
                channel.recv(1)   # until rank 1 closes its end
            os._exit(0)
        os.waitpid(child, 0)
        close_kept()


def test_a_channel_handed_to_a_process_outside_the_world_is_caught(attack):
    harness.run(open_a_channel, 2, timeout=30)
    _, problem, _ = witnessed(hand_the_channel_to_an_orphan, 2)
    assert problem is not None and problem.startswith("a TCP connection rank 0 held (") and \
        problem.endswith("is still open, but no rank holds it now: it was handed to a process outside the world")


def open_a_udp_socket():
    if dist.get_rank() == 1:
        datagrams = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        datagrams.bind(("127.0.0.1", 0))
        keep(datagrams)


def test_a_rank_holding_a_udp_socket_is_caught(attack):
    _, problem, _ = witnessed(open_a_udp_socket, 2)
    assert problem is not None and problem.startswith("rank 1 used a UDP socket")
