"""With root: what the kernel's destroy notices add to the traffic witness, and ranks told apart by uid.

The notices give the last counters of a connection that closed between two snapshots (a group
destroyed mid-call, a side channel closed after use); without them its last bytes are unknown.
Ranks each under their own uid own what their uid created, with no fd table to read.
"""
import encodings.idna  # noqa: F401  (socket needs it, and a process that gave up root cannot import it)
import os
import socket

import pytest
import torch
import torch.distributed as dist

import harness
from harness.probes import traffic
from tests.test_harness_traffic import nothing, witnessed
from tests.test_harness_traffic_attacks import kept_channel, open_a_channel, receive

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="destroy notices need CAP_NET_ADMIN, other uids setuid")


def keep_a_subgroup():
    dist._kept_traffic_group = dist.new_group([0, 1])


def use_and_destroy_the_subgroup():
    dist.all_reduce(torch.ones(10), group=dist._kept_traffic_group)
    dist.destroy_process_group(dist._kept_traffic_group)
    del dist._kept_traffic_group


def test_a_group_destroyed_during_a_call_raises_no_false_alarm():
    """Its connections close as the next call starts (the tracer holds the group till then); the destroy
    notices give their last counters."""
    for fn in (keep_a_subgroup, use_and_destroy_the_subgroup, nothing):
        assert witnessed(fn, 2)[1] is None


def send_then_close_the_channel():
    """1000 bytes over the kept channel, closed before the call ends."""
    if dist.get_rank() == 0:
        kept_channel().sendall(bytes(1000))
    else:
        receive(kept_channel(), 1000)
    kept_channel().close()
    dist.barrier()


def test_a_side_channel_closed_before_the_call_ends_is_caught_from_the_destroy_notices():
    assert witnessed(open_a_channel, 2)[1] is None
    _, problem = witnessed(send_then_close_the_channel, 2)
    assert problem == "rank 0 sent rank 1 1000 bytes that no traced op explains (1144 bytes crossed; " \
                      "the trace accounts for 144)"


UIDS = (61001, 61002)   # the two "ranks" below run as these


def test_ranks_told_apart_by_uid_own_the_sockets_their_uids_made():
    """Two processes, each under its own uid, talk over TCP and keep the connection open past the snapshot."""
    port_out, port_in = os.pipe()
    done_out, done_in = os.pipe()
    go_out, go_in = os.pipe()

    def listen():
        with socket.create_server(("127.0.0.1", 0)) as listener:
            os.write(port_in, listener.getsockname()[1].to_bytes(2, "big"))
            connection, _ = listener.accept()
            receive(connection, 5000)
            os.write(done_in, b"1")
            os.read(go_out, 1)

    def send():
        with socket.create_connection(("127.0.0.1", int.from_bytes(os.read(port_out, 2), "big"))) as connection:
            connection.sendall(b"x" * 5000)
            os.read(go_out, 1)

    owners = traffic.UidOwners(list(UIDS))
    before = owners.snapshot()
    children = [as_uid(uid, job) for uid, job in zip(UIDS, (listen, send))]
    os.read(done_out, 1)
    diff = traffic.difference(before, owners.snapshot())
    os.write(go_in, b"11")
    assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children] == [0, 0]
    # a new connection to a rank's listener may carry gloo's 8 set-up bytes: this one wrote none
    assert diff.sent == {(1, 0): 5000, (0, 1): 0} and diff.setup == {(1, 0): traffic.SETUP_BYTES}
    assert traffic.check(diff, harness.Trace([[], []], [[], []])) == \
        "rank 1 sent rank 0 4992 bytes that no traced op explains (5000 bytes crossed; the trace accounts for 8)"


def as_uid(uid: int, job) -> int:
    """Run ``job`` in a forked process that has given up root for ``uid``."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            socket.setdefaulttimeout(10)
            os.setuid(uid)
            job()
            code = 0
        finally:
            os._exit(code)
    return pid
