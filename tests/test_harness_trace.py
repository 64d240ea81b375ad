"""The trace the harness records inside the ranks: every field a problem's tests assert on."""
import torch
import torch.distributed as dist

import harness
from tests.harness_helpers import source_at


def one_all_reduce():
    t = torch.ones(3, 2) * dist.get_rank()
    dist.all_reduce(t)
    return t[0, 0].item()


def test_collective_fields():
    values, trace = harness.run(one_all_reduce, 3, timeout=10)
    assert values == [3.0] * 3
    for rank in range(3):
        [op] = trace.ops(rank)
        assert (op.rank, op.index, op.kind, op.name) == (rank, 0, "all_reduce", "c10d.allreduce_.default")
        assert op.shapes == [(3, 2)] and op.dtypes == ["torch.float32"]
        assert op.in_bytes == op.out_bytes == 24 and trace.bytes_sent(rank) == 24
        assert op.peer is None and op.group == (0, 1, 2) and op.splits is None
        assert op.phase is None and op.step is None
        assert source_at(op.site) == "dist.all_reduce(t)" and "test_harness_trace.py:" in op.site
        assert op.blocking is True and not op.is_async
        assert 0 <= op.issued_at <= op.wait_start <= op.wait_end
        assert not op.is_p2p and "all_reduce [3x2] 24 B at" in op.describe()


def sync_and_async():
    t = torch.ones(4, dtype=torch.float64)
    dist.broadcast(t, 0)
    work = dist.all_reduce(t, async_op=True)
    t.mul_(1)   # other work while the all_reduce is in flight
    work.wait()
    never_waited = dist.all_reduce(torch.ones(1), async_op=True)
    dist.barrier()
    del never_waited


def test_blocking_is_true_for_sync_calls_and_false_for_async_op():
    _, trace = harness.run(sync_and_async, 2, timeout=10)
    broadcast, all_reduce, unwaited, barrier = trace.ops(0)
    assert (broadcast.kind, broadcast.blocking, broadcast.in_bytes) == ("broadcast", True, 32)
    assert (all_reduce.kind, all_reduce.blocking, all_reduce.is_async) == ("all_reduce", False, True)
    assert all_reduce.wait_start is not None and all_reduce.wait_end >= all_reduce.wait_start
    assert (unwaited.blocking, unwaited.wait_start, unwaited.is_async) == (None, None, True)
    assert barrier.kind == "barrier" and barrier.blocking is True
    assert trace.kinds(1) == ["broadcast", "all_reduce", "all_reduce", "barrier"]


def phases_and_steps():
    t = torch.ones(1)
    for step in range(2):
        with harness.phase("backward", step=step):
            dist.all_reduce(t)
            with harness.phase("inner"):
                dist.broadcast(t, 0)
    dist.all_reduce(t)


def test_phase_and_step_of_each_op():
    _, trace = harness.run(phases_and_steps, 2, timeout=10)
    assert [(op.kind, op.phase, op.step) for op in trace.ops(1)] == [
        ("all_reduce", "backward", 0), ("broadcast", "inner", None),
        ("all_reduce", "backward", 1), ("broadcast", "inner", None), ("all_reduce", None, None)]
    assert len(trace.ops(phase="backward", step=1)) == 2
    spans = trace.phases(0, "backward")
    assert [s.step for s in spans] == [0, 1] and all(s.end >= s.start for s in spans)
    assert spans[0].end <= spans[1].start and len(trace.phases(0, "inner")) == 2


def p2p_pair():
    t = torch.arange(5, dtype=torch.int32)
    if dist.get_rank() == 0:
        dist.send(t, 1)
    else:
        dist.recv(t, 0)


def test_send_and_recv_fields():
    _, trace = harness.run(p2p_pair, 2, timeout=10)
    [send], [recv] = trace.ops(0), trace.ops(1)
    assert (send.kind, send.peer, send.in_bytes, send.out_bytes, send.is_p2p) == ("send", 1, 20, 0, True)
    assert (recv.kind, recv.peer, recv.in_bytes, recv.out_bytes) == ("recv", 0, 0, 20)
    assert send.dtypes == ["torch.int32"] and send.blocking is True and recv.blocking is True
    assert source_at(send.site) == "dist.send(t, 1)" and source_at(recv.site) == "dist.recv(t, 0)"
    assert trace.bytes_sent(0) == 20 and trace.bytes_sent(1) == 0
    assert "send to rank 1 [5] 20 B" in send.describe()


def subgroups():
    rank = dist.get_rank()
    low, high = dist.new_group([0, 1]), dist.new_group([2, 3])
    mine = low if rank < 2 else high
    t = torch.ones(2)
    dist.all_reduce(t, group=mine)
    if rank == 3:
        dist.send(t, dst=2, group=high)   # group-local rank 0
    elif rank == 2:
        dist.recv(t, src=3, group=high)
    elif rank == 1:
        dist.send(t, group_dst=0, group=low)
    else:
        dist.recv(t, group_src=1, group=low)


def test_peers_are_global_ranks_and_groups_are_their_ranks():
    _, trace = harness.run(subgroups, 4, timeout=10)
    assert [op.group for op in trace.ops(kind="all_reduce")] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [(op.kind, op.peer, op.group) for op in trace.ops(kind=("send", "recv"))] == [
        ("recv", 1, (0, 1)), ("send", 0, (0, 1)), ("recv", 3, (2, 3)), ("send", 2, (2, 3))]


def all_to_all_uneven():
    rank = dist.get_rank()
    in_splits = [1, 2] if rank == 0 else [2, 1]
    out_splits = [in_splits[0], 3 - in_splits[0]] if rank == 0 else [2, 1]
    out = torch.empty(3)
    dist.all_to_all_single(out, torch.full((3,), float(rank)), out_splits, in_splits)
    return out.tolist()


def test_all_to_all_single_records_its_splits():
    values, trace = harness.run(all_to_all_uneven, 2, timeout=10)
    assert values == [[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]
    assert trace.ops(0)[0].kind == "all_to_all" and trace.ops(0)[0].splits == ((1, 2), (1, 2))
    assert trace.ops(1)[0].splits == ((2, 1), (2, 1))
    assert trace.ops(0)[0].in_bytes == 12


def ring_exchange():
    rank, n = dist.get_rank(), dist.get_world_size()
    out, inbox = torch.full((2,), float(rank)), torch.empty(2)
    ops = [dist.P2POp(dist.isend, out, (rank + 1) % n), dist.P2POp(dist.irecv, inbox, (rank - 1) % n)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return inbox[0].item()


def test_batch_isend_irecv_records_each_op():
    values, trace = harness.run(ring_exchange, 3, timeout=10)
    assert values == [2.0, 0.0, 1.0]
    for rank in range(3):
        ops = sorted(trace.ops(rank), key=lambda op: op.kind)
        assert [(op.kind, op.peer) for op in ops] == [("recv", (rank - 1) % 3), ("send", (rank + 1) % 3)]
        assert all(op.is_async and op.in_bytes + op.out_bytes == 8 for op in ops)


def test_each_call_has_its_own_trace():
    first = harness.run(phases_and_steps, 2, timeout=10).trace
    second = harness.run(p2p_pair, 2, timeout=10).trace
    assert len(first.ops(0)) == 5 and [op.kind for op in second.ops(0)] == ["send"]
    assert second.phases(0) == [] and second.ops(0)[0].index == 0
