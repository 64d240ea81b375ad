"""The traffic witness catches what the trace does not show; each test is named after one attack.

Every call runs between two kernel snapshots of its world's sockets, and a difference the trace does not
explain fails the call as ``TraceTampered``: a side channel between ranks beside zero-filled decoys, an
op the tracer cannot see, a forged record, a connection out of the world (held by the rank or by a
process it forked), a channel handed to a process outside the world, a UDP socket, traffic between
calls.  What the kernel's destroy notices add needs root: tests/test_harness_traffic_root.py.
"""
import os
import socket
import threading
import time

import pytest
import torch
import torch.distributed as dist

import harness
from harness.probes import traffic
from tests.test_harness_traffic import nothing, witnessed

KEPT = "_traffic_test_sockets"   # where an attack keeps its sockets past the call (torch.distributed's module)


def keep(*sockets):
    setattr(dist, KEPT, getattr(dist, KEPT, []) + list(sockets))


def rank_to_rank_channel(looks_like_gloo: bool = False):
    """A TCP connection from rank 0 to a listener of rank 1, whose port a traced all_reduce carries.
    ``looks_like_gloo``: the connecting side writes the 8 bytes a process group's new connection starts
    with, so that the connection itself passes for one."""
    rank = dist.get_rank()
    listener = socket.create_server(("127.0.0.1", 0)) if rank == 1 else None
    port = torch.tensor([listener.getsockname()[1] if listener else 0])
    dist.all_reduce(port)
    if rank == 0:
        channel = socket.create_connection(("127.0.0.1", int(port)))
        if looks_like_gloo:
            channel.sendall(bytes(traffic.SETUP_BYTES))
    else:
        channel, _ = listener.accept()
        if looks_like_gloo:
            receive(channel, traffic.SETUP_BYTES)
        keep(listener)
    keep(channel)
    return channel


def receive(connection, nbytes: int) -> bytes:
    received = b""
    while len(received) < nbytes:
        received += connection.recv(1 << 16)
    return received


def kept_channel():
    return getattr(dist, KEPT)[-1]


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


def test_a_side_channel_over_tcp_with_zero_filled_decoy_collectives_is_caught():
    _, problem = witnessed(side_channel_with_decoys, 2, 1000)
    # 4000 bytes of data, less the 8 a new connection's set-up is allowed
    assert problem is not None and problem.startswith("rank 0 sent rank 1 3992 bytes that no traced op explains")


def open_a_channel(looks_like_gloo: bool = True):
    rank_to_rank_channel(looks_like_gloo)


def test_a_bare_connection_between_ranks_is_caught():
    """A new connection must start as a process group's does; an idle one of the code's own does not."""
    _, problem = witnessed(open_a_channel, 2, False)
    assert problem == "rank 0 opened a connection to rank 1 that did not start as a process group's " \
                      "(0 set-up bytes, not 8)"


def one_byte_beside(decoy):
    """One byte over the channel an earlier call opened (passing for a process group's), beside a decoy."""
    if dist.get_rank() == 1:
        kept_channel().sendall(b"x")
    else:
        kept_channel().recv(1)
    DECOYS[decoy]()


DECOYS = {"all_reduce": lambda: dist.all_reduce(torch.zeros(256)),
          "all_gather": lambda: dist.all_gather_into_tensor(torch.empty(512), torch.zeros(256)),
          "all_to_all": lambda: dist.all_to_all_single(torch.empty(256), torch.zeros(256)),
          "send_recv": lambda: (dist.send(torch.zeros(256), 1) if dist.get_rank() == 0
                                else dist.recv(torch.empty(256), 0)),
          "broadcast": lambda: dist.broadcast(torch.zeros(256), 1),
          "barrier": dist.barrier}


@pytest.mark.parametrize("decoy", DECOYS)
def test_one_byte_through_a_kept_side_channel_beside_any_collective_is_caught(decoy):
    assert witnessed(open_a_channel, 2)[1] is None   # 8 bytes that pass for a new group's connection
    _, problem = witnessed(one_byte_beside, 2, decoy)
    assert problem is not None and problem.startswith("rank 1 sent rank 0 1 bytes that no traced op explains")


def leave_a_thread_sending():
    """A thread that outlives the call sends 500 bytes over the kept channel while no call runs."""
    if dist.get_rank() == 0:
        threading.Timer(0.3, kept_channel().sendall, [bytes(500)]).start()


def test_traffic_between_calls_is_checked_with_the_next_call():
    """The witness's end of one call is its beginning of the next: no moment goes unwatched."""
    assert witnessed(open_a_channel, 2)[1] is None
    assert witnessed(leave_a_thread_sending, 2)[1] is None
    time.sleep(0.6)
    problem = witnessed(nothing, 2)[1]
    assert problem is not None and problem.startswith("rank 0 sent rank 1 500 bytes that no traced op explains")


def untraced_all_reduce_past_the_counters():
    """An all_reduce the tracer cannot see (inference-mode tensors skip its kernels), with the in-rank
    op-counter check told it ran nothing more than the trace says (its baseline moved by hand)."""
    from harness.record.recorder import active
    dist.all_reduce(torch.ones(4))
    with torch.inference_mode():
        dist.all_reduce(torch.ones(1000))
    for group in active().groups.values():
        group["start"] += 1
    return 0


def test_an_untraced_op_with_the_counter_baseline_edited_is_caught():
    _, problem = witnessed(untraced_all_reduce_past_the_counters, 2)
    assert problem is not None and "bytes that no traced op explains" in problem


def forge_a_record_of_an_all_reduce_that_never_ran():
    """The record stream and the tracer's own lists both say a second all_reduce ran, and the in-rank
    op-counter check is told its group's counter moved for it: it did not run."""
    from harness.record.recorder import active
    dist.all_reduce(torch.ones(4))
    recorder = active()
    forged = dict(recorder.ops[0], index=1, shapes=[(1024,)], in_bytes=4096, out_bytes=4096)
    recorder.ops.append(forged)
    for ev in ("issue", "wait", "done"):
        recorder.flight(ev=ev, i=1, op=recorder.exported(forged))
    for group in recorder.groups.values():
        group["start"] -= 1
    return 0


def test_a_forged_record_of_an_all_reduce_that_never_ran_is_caught():
    _, problem = witnessed(forge_a_record_of_an_all_reduce_that_never_ran, 2)
    assert problem is not None and "a traced op did not run" in problem, problem


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
    time.sleep(0.3)   # (the helper connects before the call ends)


@pytest.mark.parametrize("calls_home", [call_home, call_home_from_a_helper], ids=lambda f: f.__name__)
def test_a_rank_connecting_to_a_listener_in_the_test_process_is_caught(calls_home):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        listener.settimeout(30)
        accepting = threading.Thread(target=lambda: listener.accept()[0].recv(64), daemon=True)
        accepting.start()
        _, problem = witnessed(calls_home, 2, port)
    assert problem is not None
    assert problem.startswith(f"rank 0 holds a TCP connection to a process outside its world (127.0.0.1:{port},")


def hand_the_channel_to_an_orphan():
    """Rank 0's end of the kept channel goes to a grandchild that its parent leaves, so that it is no
    rank's descendant; the rank closes its own copy."""
    if dist.get_rank() == 0:
        channel = kept_channel()
        child = os.fork()
        if child == 0:
            if os.fork() == 0:
                channel.recv(1)   # until rank 1 closes its end
            os._exit(0)
        os.waitpid(child, 0)
        channel.close()


def test_a_channel_handed_to_a_process_outside_the_world_is_caught():
    assert witnessed(open_a_channel, 2)[1] is None
    _, problem = witnessed(hand_the_channel_to_an_orphan, 2)
    assert problem is not None and problem.startswith("a TCP connection rank 0 held (") and \
        problem.endswith("is still open, but no rank holds it now: it was handed to a process outside the world")


def open_a_udp_socket():
    if dist.get_rank() == 1:
        datagrams = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        datagrams.bind(("127.0.0.1", 0))
        keep(datagrams)


def test_a_rank_holding_a_udp_socket_is_caught():
    _, problem = witnessed(open_a_udp_socket, 2)
    assert problem is not None and problem.startswith("rank 1 used a UDP socket")
