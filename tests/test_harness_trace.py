"""The trace the harness records inside the ranks: every field a problem's tests assert on."""
import contextlib

import pytest
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


def gather_and_scatter():
    shard, full = torch.ones(2), torch.empty(4)
    dist.all_gather_into_tensor(full, shard)
    dist.reduce_scatter_tensor(shard, full)


def test_a_deprecated_collective_is_placed_at_the_code_that_called_it():
    """torch 2.13 wraps all_gather_into_tensor and reduce_scatter_tensor in typing_extensions' @deprecated:
    the op's site is still the line of the code under test, not the wrapper's."""
    _, trace = harness.run(gather_and_scatter, 2, timeout=10)
    gather, scatter = trace.ops(0)
    assert source_at(gather.site) == "dist.all_gather_into_tensor(full, shard)", gather.site
    assert source_at(scatter.site) == "dist.reduce_scatter_tensor(shard, full)", scatter.site


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


def functional_all_reduce():
    import torch.distributed._functional_collectives as funcol
    x = torch.ones(3, requires_grad=True)
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    y.sum().backward()   # torch's autograd formula for it still runs: its backward all_reduces too
    return x.grad.tolist()


def test_a_functional_all_reduce_is_traced_like_any_op():
    values, trace = harness.run(functional_all_reduce, 2, timeout=30)
    assert values == [[4.0] * 3] * 2
    forward, backward = trace.ops(0)
    assert (forward.kind, forward.name) == ("all_reduce", "_c10d_functional.all_reduce.default")
    assert forward.in_bytes == forward.out_bytes == 12 and forward.group == (0, 1)
    assert source_at(forward.site) == 'y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)'
    assert forward.wait_end is not None and forward.blocking is False   # waited on first use, in the next line
    assert backward.kind == "all_reduce" and backward.index == 1


# ---- what a call can ask the harness to measure or change (probes) ---------------------------------------

def ring_attention_step(overlap: bool):
    """One step of a ring: post the next KV block's exchange, attend to the current block, wait.
    The realistic bug waits right after posting, so nothing runs while the block is in flight."""
    rank, n = dist.get_rank(), dist.get_world_size()
    q, k, v = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    next_k = torch.empty(4, 8)
    works = [dist.isend(k, (rank + 1) % n), dist.irecv(next_k, (rank - 1) % n)]
    if not overlap:
        for work in works:
            work.wait()
    out = torch.softmax(q @ k.T / 8 ** 0.5, dim=-1) @ v   # mm, _softmax, mm
    if overlap:
        for work in works:
            work.wait()
    return out.shape[0]


def ring_attention_step_returning(in_flight: str):
    """The step, returning its output.  ``in_flight``: what runs while the block travels -- "attention" (the
    real work), "dummy" (an exp of a tensor no output uses), "under no_grad" (the real work, as a custom
    autograd Function's forward does it) or "nothing"."""
    rank, n = dist.get_rank(), dist.get_world_size()
    q, k, v = (torch.randn(4, 8) for _ in range(3))
    next_k = torch.empty(4, 8)
    works = [dist.isend(k, (rank + 1) % n), dist.irecv(next_k, (rank - 1) % n)]
    if in_flight == "dummy":
        torch.exp(q).sum()                                   # work on data no output depends on
    if in_flight in ("attention", "under no_grad"):
        with torch.no_grad() if in_flight == "under no_grad" else contextlib.nullcontext():
            out = torch.softmax(q @ k.T / 8 ** 0.5, dim=-1) @ v
    for work in works:
        work.wait()
    if in_flight in ("dummy", "nothing"):
        out = torch.softmax(q @ k.T / 8 ** 0.5, dim=-1) @ v
    result = torch.zeros(4, 8)
    result[:, :] = out                                       # written in place: the provenance follows
    return result


@pytest.mark.parametrize("in_flight, between, used", [("attention", 3, 3), ("under no_grad", 3, 3), ("dummy", 1, 0),
                                                      ("nothing", 0, 0)])
def test_compute_used_counts_only_in_flight_work_the_result_needed(in_flight, between, used):
    trace = harness.run(ring_attention_step_returning, 2, in_flight, probes=[harness.Compute()], timeout=30).trace
    for rank in range(2):
        recv = trace.ops(rank, "recv")[0]
        assert (recv.compute_between, recv.compute_used) == (between, used), recv


def test_compute_between_counts_what_a_rank_computes_while_its_messages_are_in_flight():
    overlapped = harness.run(ring_attention_step, 3, True, probes=[harness.Compute()], timeout=30).trace
    wait_first = harness.run(ring_attention_step, 3, False, probes=[harness.Compute()], timeout=30).trace
    for rank in range(3):
        assert [op.compute_between for op in overlapped.ops(rank)] == [3, 3]   # q @ k.T, softmax, @ v
        assert [op.compute_between for op in wait_first.ops(rank)] == [0, 0]


def test_compute_between_is_none_unless_asked_for_and_zero_for_a_blocking_op():
    untimed = harness.run(ring_attention_step, 2, True, timeout=30).trace
    assert [op.compute_between for op in untimed.ops(0)] == [None, None]
    blocking = harness.run(one_all_reduce, 2, probes=[harness.Compute()], timeout=30).trace
    assert blocking.ops(0)[0].compute_between == 0


def send_ones_twice():
    t = torch.ones(3)
    if dist.get_rank() == 0:
        dist.send(t, 1)
        dist.isend(t, 1).wait()
        return t.tolist()
    first, second = torch.empty(3), torch.empty(3)
    dist.recv(first, 0)
    ops = dist.batch_isend_irecv([dist.P2POp(dist.irecv, second, 0)])
    for work in ops:
        work.wait()
    return [first.tolist(), second.tolist()]


@pytest.mark.parametrize("nth", [0, 1])
def test_perturb_changes_only_the_nth_send_as_it_travels(nth):
    values, trace = harness.run(send_ones_twice, 2, probes=[harness.Perturb(0, nth)], timeout=30)
    sent = [[1.0] * 3, [1.0] * 3]
    sent[nth] = [2.0] * 3
    assert values == [[1.0] * 3, sent]   # rank 0's own tensor is still ones
    assert [op.perturbed for op in trace.ops(0)] == [i == nth for i in range(2)]
    assert not any(op.perturbed for op in trace.ops(1))


def test_perturb_names_a_rank_and_a_send_index():
    with pytest.raises(ValueError, match="two integers >= 0"):
        harness.Perturb(0, -1)
    with pytest.raises(ValueError, match="two integers >= 0"):
        harness.Perturb(True, 1)


def compiled_all_reduce():
    @torch.compile(backend="eager")
    def step(x):
        y = x * 2
        dist.all_reduce(y)   # dynamo turns it into a functional all_reduce
        return y + 1
    return step(torch.ones(3)).tolist()


def test_a_compiled_functions_collectives_are_traced_once():
    """torch.compile first traces with fake tensors, which send nothing: only the real run is recorded."""
    values, trace = harness.run(compiled_all_reduce, 2, timeout=120)
    assert values == [[5.0] * 3] * 2
    assert [op.kind for op in trace.ops(0)] == ["all_reduce"] and trace.ops(0)[0].in_bytes == 12
