"""The op-count check never cries wolf, and still catches what bypasses the tracer.

After every call each rank compares its trace with gloo's own per-group op counters (C++, out of
Python's reach).  The first half runs every public torch.distributed collective and point-to-point
call, and the functional collectives, sync and with async_op=True, on the default group and on a
subgroup, at world sizes 2 and 3: each is traced exactly as torch runs it (one record per c10d op,
with the right kind, group and peer) and none raises a tamper report.  The second half is the
attacks; each test is named after one.
"""
import warnings

import pytest
import torch
import torch.distributed as dist

import harness
from tests.harness_helpers import assert_fresh_world_works, pids


class Group:
    """The group a batch of calls runs on, as this rank sees it."""

    def __init__(self, pg):
        self.pg = pg
        self.ranks = dist.get_process_group_ranks(pg) if pg is not None else list(range(dist.get_world_size()))
        self.member = dist.get_rank() in self.ranks
        self.me = self.ranks.index(dist.get_rank()) if self.member else None
        self.size, self.root = len(self.ranks), self.ranks[0]
        self.kw = {"group": pg}

    def neighbour(self, step: int) -> int:
        """The global rank ``step`` places along the ring of this group."""
        return self.ranks[(self.me + step) % self.size]

    @property
    def as_funcol(self):
        return self.pg if self.pg is not None else dist.group.WORLD


def ones(*shape):
    return torch.ones(*shape)


def finish(work, async_op):
    if async_op:
        work.wait()


def uneven_all_to_all(g, a):
    in_splits = [peer + 1 for peer in range(g.size)]    # peer j gets j + 1 rows from everyone
    out_splits = [g.me + 1] * g.size
    finish(dist.all_to_all_single(ones(sum(out_splits)), ones(sum(in_splits)), out_splits, in_splits,
                                  async_op=a, **g.kw), a)


def send_then_recv(g, a):
    """A ring: group rank 0 sends first, the others receive first (gloo's send blocks until matched)."""
    out, inbox = ones(2), torch.empty(2)
    if g.me == 0:
        dist.send(out, g.neighbour(1), **g.kw)
        dist.recv(inbox, g.neighbour(-1), **g.kw)
    else:
        dist.recv(inbox, g.neighbour(-1), **g.kw)
        dist.send(out, g.neighbour(1), **g.kw)


def isend_irecv(g, a):
    sending = dist.isend(ones(2), g.neighbour(1), **g.kw)
    receiving = dist.irecv(torch.empty(2), g.neighbour(-1), **g.kw)
    sending.wait()
    receiving.wait()


def batch_isend_irecv(g, a):
    ops = [dist.P2POp(dist.isend, ones(2), g.neighbour(1), **g.kw),
           dist.P2POp(dist.irecv, torch.empty(2), g.neighbour(-1), **g.kw)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def recv_from_any_source(g, a):
    if g.me == 0:
        for _ in range(g.size - 1):
            dist.recv(torch.empty(2), **g.kw)
    else:
        dist.send(ones(2), g.root, **g.kw)


def coalesced(collective):
    def run(g, a):
        with dist._coalescing_manager(async_ops=True, **g.kw) as manager:
            collective(g)
            collective(g)
        manager.wait()
    return run


def funcol():
    import torch.distributed._functional_collectives as funcol
    return funcol


def functional_ops(namespace="_c10d_functional"):
    return getattr(getattr(torch, "ops"), namespace)


def functional_isend_irecv(g, a):
    """The ops themselves: they take group ranks (torch 2.13's isend_inplace passes a global rank)."""
    name = g.as_funcol.group_name
    sent = functional_ops().isend(ones(2), (g.me + 1) % g.size, 0, name)
    received = functional_ops().irecv(torch.empty(2), (g.me - 1) % g.size, 0, name)
    funcol().wait_tensor(sent)
    funcol().wait_tensor(received)


def functional_batch_p2p(g, a):
    outputs = functional_ops().batch_p2p_ops(["isend", "irecv"], [(g.me + 1) % g.size, (g.me - 1) % g.size],
                                             [0, 0], [ones(2), torch.empty(2)], g.as_funcol.group_name)
    for t in outputs:
        funcol().wait_tensor(t)


def each_rank(kinds):
    return lambda me, size: list(kinds)


# name -> (run(g, a): the call on Group g, with async_op=a where it takes one;
#          kinds(me, size): what it is traced as, in order, on group rank ``me`` of ``size``;
#          whether it takes async_op: then its records are blocking exactly when it is not async)
CALLS = {
    "all_reduce": (lambda g, a: finish(dist.all_reduce(ones(2), async_op=a, **g.kw), a),
                   each_rank(["all_reduce"]), True),
    "broadcast": (lambda g, a: finish(dist.broadcast(ones(2), g.root, async_op=a, **g.kw), a),
                  each_rank(["broadcast"]), True),
    "all_gather": (lambda g, a: finish(dist.all_gather([ones(2) for _ in range(g.size)], ones(2), async_op=a,
                                                       **g.kw), a),
                   each_rank(["all_gather"]), True),
    "all_gather_into_tensor": (lambda g, a: finish(dist.all_gather_into_tensor(ones(2 * g.size), ones(2),
                                                                               async_op=a, **g.kw), a),
                               each_rank(["all_gather"]), True),
    "reduce_scatter": (lambda g, a: finish(dist.reduce_scatter(ones(2), list(ones(2 * g.size).chunk(g.size)),
                                                               async_op=a, **g.kw), a),
                       each_rank(["reduce_scatter"]), True),
    "reduce_scatter_tensor": (lambda g, a: finish(dist.reduce_scatter_tensor(ones(2), ones(2 * g.size),
                                                                             async_op=a, **g.kw), a),
                              each_rank(["reduce_scatter"]), True),
    "all_to_all": (lambda g, a: finish(dist.all_to_all([ones(2) for _ in range(g.size)],
                                                       [ones(2) for _ in range(g.size)], async_op=a, **g.kw), a),
                   each_rank(["all_to_all"]), True),
    "all_to_all_single": (lambda g, a: finish(dist.all_to_all_single(ones(2 * g.size), ones(2 * g.size),
                                                                     async_op=a, **g.kw), a),
                          each_rank(["all_to_all"]), True),
    "all_to_all_single_uneven": (uneven_all_to_all, each_rank(["all_to_all"]), True),
    "reduce": (lambda g, a: finish(dist.reduce(ones(2), g.root, async_op=a, **g.kw), a),
               each_rank(["reduce"]), True),
    "gather": (lambda g, a: finish(dist.gather(ones(2), [ones(2) for _ in range(g.size)] if g.me == 0 else None,
                                               g.root, async_op=a, **g.kw), a),
               each_rank(["gather"]), True),
    "scatter": (lambda g, a: finish(dist.scatter(ones(2), [ones(2) for _ in range(g.size)] if g.me == 0 else None,
                                                 g.root, async_op=a, **g.kw), a),
                each_rank(["scatter"]), True),
    "barrier": (lambda g, a: finish(dist.barrier(async_op=a, **g.kw), a), each_rank(["barrier"]), True),
    "monitored_barrier": (lambda g, a: dist.monitored_barrier(**g.kw), each_rank(["barrier"]), False),
    "monitored_barrier_wait_all_ranks": (lambda g, a: dist.monitored_barrier(wait_all_ranks=True, **g.kw),
                                         each_rank(["barrier"]), False),
    # object collectives are several c10d ops each: sizes first, then the pickled bytes
    "all_gather_object": (lambda g, a: dist.all_gather_object([None] * g.size, {"rank": g.me}, **g.kw),
                          each_rank(["all_gather", "all_gather"]), False),
    "broadcast_object_list": (lambda g, a: dist.broadcast_object_list([g.me, "x"], g.root, **g.kw),
                              each_rank(["broadcast", "broadcast"]), False),
    "scatter_object_list": (lambda g, a: dist.scatter_object_list([None], list(range(g.size)) if g.me == 0 else None,
                                                                  g.root, **g.kw),
                            each_rank(["broadcast", "scatter", "scatter"]), False),
    "gather_object": (lambda g, a: dist.gather_object(g.me, [None] * g.size if g.me == 0 else None, g.root, **g.kw),
                      each_rank(["all_gather", "gather"]), False),
    "send_recv": (send_then_recv, lambda me, size: ["send", "recv"] if me == 0 else ["recv", "send"], False),
    "isend_irecv": (isend_irecv, each_rank(["send", "recv"]), False),
    "batch_isend_irecv": (batch_isend_irecv, each_rank(["send", "recv"]), False),
    "recv_from_any_source": (recv_from_any_source,
                             lambda me, size: ["recv"] * (size - 1) if me == 0 else ["send"], False),
    "all_reduce_coalesced": (lambda g, a: finish(dist.all_reduce_coalesced([ones(2), ones(3)], async_op=a, **g.kw),
                                                 a),
                             each_rank(["all_reduce"]), True),
    "all_gather_coalesced": (lambda g, a: finish(dist.all_gather_coalesced([[ones(2)] for _ in range(g.size)],
                                                                           [ones(2)], async_op=a, **g.kw), a),
                             each_rank(["all_gather"]), True),
    "coalesced_all_reduce": (coalesced(lambda g: dist.all_reduce(ones(2), **g.kw)), each_rank(["all_reduce"]), False),
    "coalesced_all_gather_into_tensor": (coalesced(lambda g: dist.all_gather_into_tensor(ones(2 * g.size), ones(2),
                                                                                         **g.kw)),
                                         each_rank(["all_gather"]), False),
    "coalesced_reduce_scatter_tensor": (coalesced(lambda g: dist.reduce_scatter_tensor(ones(2), ones(2 * g.size),
                                                                                       **g.kw)),
                                        each_rank(["reduce_scatter"]), False),
    # functional collectives (torch.distributed._functional_collectives): traced like any other op
    "functional_all_reduce": (lambda g, a: funcol().all_reduce(ones(2), "sum", g.as_funcol).wait(),
                              each_rank(["all_reduce"]), False),
    "functional_all_reduce_inplace": (lambda g, a: funcol().all_reduce_inplace(ones(2), "sum", g.as_funcol),
                                      each_rank(["all_reduce"]), False),
    "functional_all_gather_tensor": (lambda g, a: funcol().all_gather_tensor(ones(2), 0, g.as_funcol).wait(),
                                     each_rank(["all_gather"]), False),
    "functional_reduce_scatter_tensor": (lambda g, a: funcol().reduce_scatter_tensor(ones(2 * g.size), "sum", 0,
                                                                                     g.as_funcol).wait(),
                                         each_rank(["reduce_scatter"]), False),
    "functional_all_to_all_single": (lambda g, a: funcol().all_to_all_single(ones(2 * g.size), None, None,
                                                                             g.as_funcol).wait(),
                                     each_rank(["all_to_all"]), False),
    "functional_broadcast": (lambda g, a: funcol().broadcast(ones(2), g.root, g.as_funcol).wait(),
                             each_rank(["broadcast"]), False),
    "functional_all_reduce_coalesced": (lambda g, a: [t.wait() for t in funcol().all_reduce_coalesced(
                                            [ones(2), ones(3)], "sum", g.as_funcol)],
                                        each_rank(["all_reduce"]), False),
    "functional_all_gather_into_tensor_coalesced": (lambda g, a: [t.wait() for t in funcol()
                                                                  .all_gather_into_tensor_coalesced(
                                                                      [ones(2), ones(3)], g.as_funcol)],
                                                    each_rank(["all_gather"]), False),
    "functional_reduce_scatter_tensor_coalesced": (lambda g, a: [t.wait() for t in funcol()
                                                                 .reduce_scatter_tensor_coalesced(
                                                                     [ones(2 * g.size), ones(3 * g.size)], "sum",
                                                                     [0, 0], g.as_funcol)],
                                                   each_rank(["reduce_scatter"]), False),
    "functional_all_gather_tensor_autograd": (lambda g, a: funcol().all_gather_tensor_autograd(
                                                  ones(2), 0, g.as_funcol).wait(),
                                              each_rank(["all_gather"]), False),
    "functional_reduce_scatter_tensor_autograd": (lambda g, a: funcol().reduce_scatter_tensor_autograd(
                                                      ones(2 * g.size), "sum", 0, g.as_funcol).wait(),
                                                  each_rank(["reduce_scatter"]), False),
    "functional_all_to_all_single_autograd": (lambda g, a: funcol().all_to_all_single_autograd(
                                                  ones(2 * g.size), None, None, g.as_funcol).wait(),
                                              each_rank(["all_to_all"]), False),
    "functional_shard_dim_alltoall": (lambda g, a: funcol().wait_tensor(functional_ops("_dtensor").shard_dim_alltoall(
                                          ones(2 * g.size, g.size), 0, 1, g.as_funcol.group_name)),
                                      each_rank(["all_to_all"]), False),
    "functional_legacy_all_reduce": (lambda g, a: funcol().wait_tensor(functional_ops("c10d_functional").all_reduce(
                                         ones(2), "sum", "", g.ranks, g.size)),
                                     each_rank(["all_reduce"]), False),
    "functional_isend_irecv": (functional_isend_irecv, each_rank(["send", "recv"]), False),
    "functional_batch_p2p_ops": (functional_batch_p2p, each_rank(["send", "recv"]), False),
}


def _this_torch_has(name: str) -> bool:
    """Functional collectives come and go between torch versions: test the ones this torch has."""
    import torch.distributed._functional_collectives as funcol_module
    ops = {"functional_isend_irecv": ("_c10d_functional", "isend"),
           "functional_batch_p2p_ops": ("_c10d_functional", "batch_p2p_ops"),
           "functional_shard_dim_alltoall": ("_dtensor", "shard_dim_alltoall"),
           "functional_legacy_all_reduce": ("c10d_functional", "all_reduce")}
    if name in ops:
        namespace, op = ops[name]
        return hasattr(getattr(torch.ops, namespace), op)
    helper = {"functional_all_reduce_inplace": "all_reduce_inplace",
              "functional_all_gather_tensor_autograd": "all_gather_tensor_autograd",
              "functional_reduce_scatter_tensor_autograd": "reduce_scatter_tensor_autograd",
              "functional_all_to_all_single_autograd": "all_to_all_single_autograd"}.get(name)
    return helper is None or hasattr(funcol_module, helper)


NAMES = [name for name in CALLS if _this_torch_has(name)]


def run_calls(names, on_subgroup, async_op):
    """Run each named call in its own phase, on the default group or on a subgroup (ranks 1.. at N=3,
    so group ranks and global ranks differ), then destroy the subgroup (its counter is checked then)."""
    warnings.simplefilter("ignore")   # deprecated names are part of the public surface too
    n = dist.get_world_size()
    subgroup = dist.new_group(list(range(1, n)) if n > 2 else [0, 1]) if on_subgroup else None
    g = Group(subgroup)
    if g.member:
        for name in names:
            with harness.phase(name):
                CALLS[name][0](g, async_op)
    if subgroup is not None:
        dist.destroy_process_group(subgroup)


CONFIGS = [(n, on_subgroup, async_op) for n in (2, 3) for on_subgroup in (False, True) for async_op in (False, True)]
_BATCHES: dict = {}


def _run(config, names):
    n, on_subgroup, async_op = config
    return harness.run(run_calls, n, names, on_subgroup, async_op, timeout=60)


def _batch(config):
    """Every call of a configuration in one harness.run: a world per configuration, not per call."""
    if config not in _BATCHES:
        try:
            _BATCHES[config] = _run(config, NAMES)
        except BaseException as error:   # TraceTampered is a BaseException
            _BATCHES[config] = error
    return _BATCHES[config]


def _config_id(config):
    n, on_subgroup, async_op = config
    return f"N{n}-{'subgroup' if on_subgroup else 'world'}-{'async' if async_op else 'sync'}"


@pytest.mark.parametrize("config", CONFIGS, ids=_config_id)
@pytest.mark.parametrize("name", NAMES)
def test_every_call_is_traced_exactly_once_and_raises_no_tamper_report(name, config):
    result = _batch(config)
    if isinstance(result, BaseException):
        result = _run(config, [name])   # the batch failed: this call alone says whether it is the culprit
    run, expected_kinds, takes_async = CALLS[name]
    n, on_subgroup, async_op = config
    members = list(range(1, n)) if on_subgroup and n > 2 else list(range(n))
    for rank in range(n):
        ops = result.trace.ops(rank, phase=name)
        if rank not in members:
            assert ops == [], f"rank {rank} is not in the group but traced {[op.kind for op in ops]}"
            continue
        me = members.index(rank)
        assert [op.kind for op in ops] == expected_kinds(me, len(members)), \
            f"rank {rank}: {[op.describe() for op in ops]}"
        assert all(op.group == tuple(members) for op in ops), [op.group for op in ops]
        for op in ops:
            if op.kind in ("send", "recv") and op.peer is not None:
                ring = {"send": members[(me + 1) % len(members)], "recv": members[(me - 1) % len(members)]}
                if name == "recv_from_any_source":
                    ring = {"send": members[0]}
                assert op.peer == ring[op.kind], f"rank {rank}: {op.describe()}"
        if name.startswith("functional"):
            assert all(op.name.startswith(("_c10d_functional.", "_dtensor.")) for op in ops), [op.name for op in ops]
            assert all(op.wait_end is not None for op in ops), "its wait_tensor was not recorded"
        if takes_async:
            assert all(op.blocking is (not async_op) for op in ops), [op.blocking for op in ops]


def reduce_scatter_a_list():
    out = torch.empty(2)
    dist.reduce_scatter(out, list(torch.ones(4).chunk(2)))
    return out.tolist()


def test_a_list_reduce_scatter_alone_is_no_false_alarm():
    """gloo runs it as one reduce per member: its counter moves by the group's size, not by 1."""
    values, trace = harness.run(reduce_scatter_a_list, 2, timeout=30)
    assert values == [[2.0, 2.0]] * 2 and trace.kinds(0) == trace.kinds(1) == ["reduce_scatter"]


# ---- attacks ---------------------------------------------------------------------------------------

def untraced_all_reduce(group):
    """An op the tracer cannot see: inference-mode tensors skip the autograd keys its kernel sits on."""
    with torch.inference_mode():
        dist.all_reduce(torch.ones(2), group=group)


def untraced_op_on_a_subgroup_then_destroy_it():
    subgroup = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(2), group=subgroup)   # traced
    untraced_all_reduce(subgroup)
    dist.destroy_process_group(subgroup)             # its counter would go with it
    return "got away with it"


def untraced_op_on_a_subgroup_then_destroy_it_and_catch_the_verdict():
    subgroup = dist.new_group([0, 1])
    untraced_all_reduce(subgroup)
    try:
        dist.destroy_process_group(subgroup)
    except BaseException:
        pass
    dist.all_reduce(torch.ones(2))   # carry on as if nothing happened
    return "got away with it"


def untraced_op_on_a_subgroup_hidden_from_torchs_group_list():
    subgroup = dist.new_group([0, 1])
    untraced_all_reduce(subgroup)
    world = dist.distributed_c10d._world
    for table in (world.pg_map, world.pg_names, world.pg_group_ranks, world.pg_backend_config):
        table.pop(subgroup, None)
    return "got away with it"


@pytest.mark.parametrize("attack", [untraced_op_on_a_subgroup_then_destroy_it,
                                    untraced_op_on_a_subgroup_then_destroy_it_and_catch_the_verdict,
                                    untraced_op_on_a_subgroup_hidden_from_torchs_group_list],
                         ids=lambda f: f.__name__)
def test_an_untraced_op_on_a_group_that_is_then_destroyed_or_hidden_is_caught(attack):
    before = pids(2)
    # (torch forgets the ranks of a group hidden from its list: the message then gives its size and name)
    with pytest.raises(harness.TraceTampered, match=r"group (\[0, 1\]|of 2 ranks named '\d+') ran (1|2) "
                                                    r"communication ops but the harness traced (0|1)"):
        harness.run(attack, 2, timeout=30)
    assert_fresh_world_works(2, before)


def keep_a_subgroup():
    dist._kept_subgroup = dist.new_group([0, 1])


def untraced_op_on_a_subgroup_from_an_earlier_call_then_destroy_it():
    subgroup = dist._kept_subgroup
    untraced_all_reduce(subgroup)
    dist.destroy_process_group(subgroup)


def test_an_untraced_op_on_a_subgroup_made_in_an_earlier_call_then_destroyed_is_caught():
    harness.run(keep_a_subgroup, 2, timeout=30)
    with pytest.raises(harness.TraceTampered, match=r"group \[0, 1\] ran 1 communication ops but the harness "
                                                    r"traced 0"):
        harness.run(untraced_op_on_a_subgroup_from_an_earlier_call_then_destroy_it, 2, timeout=30)


def destroy_a_subgroup_after_honest_ops():
    subgroup = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(2), group=subgroup)
    dist.reduce_scatter(torch.empty(1), list(torch.ones(2).chunk(2)), group=subgroup)
    dist.destroy_process_group(subgroup)
    return dist.get_rank()


def test_destroying_a_subgroup_after_honest_ops_is_no_false_alarm():
    assert harness.run(destroy_a_subgroup_after_honest_ops, 2, timeout=30).values == [0, 1]


def fake_the_op_counter():
    pg_class = type(dist.group.WORLD)
    real = pg_class._get_sequence_number_for_group
    pg_class._get_sequence_number_for_group = lambda self: real(self) - 1   # hides one op
    untraced_all_reduce(None)


def test_a_python_stand_in_for_the_op_counter_is_caught():
    before = pids(2)
    with pytest.raises(harness.TraceTampered, match=r"tracer was modified \(ProcessGroup._get_sequence_number"):
        harness.run(fake_the_op_counter, 2, timeout=30)
    assert_fresh_world_works(2, before)



def replace_the_public_phase():
    import contextlib
    harness.phase = lambda *args, **kwargs: contextlib.nullcontext()


def shadow_a_method_of_the_recorders_group_half():
    from harness.record.recorder import Recorder
    Recorder.check_untampered = lambda self: None


def silence_the_waits():
    from harness.record.recorder import Recorder
    Recorder.waiting = lambda self, work: None   # what a cheating submission tried (tests/test_workflows.py)


def unplug_the_kernels_from_the_recorder():
    from harness.record import kernels as _kernels
    _kernels.active = lambda: None


def hide_memory_from_the_measurement():
    from harness import memory
    memory.live_storages = lambda *args, **kwargs: memory.Storages()


@pytest.mark.parametrize("attack, piece", [
    (replace_the_public_phase, "harness.phase"),
    (shadow_a_method_of_the_recorders_group_half, "Recorder.check_untampered"),
    (silence_the_waits, "Recorder.waiting"),
    (unplug_the_kernels_from_the_recorder, "harness.record.kernels.active"),
    (hide_memory_from_the_measurement, "harness.memory.live_storages"),
], ids=lambda x: getattr(x, "__name__", None))
def test_replacing_a_piece_of_the_tracer_is_caught(attack, piece):
    before = pids(2)
    with pytest.raises(harness.TraceTampered, match=rf"tracer was modified \({piece}\)"):
        harness.run(attack, 2, timeout=30)
    assert_fresh_world_works(2, before)


# ---- the records the op-count check reads are the ones the test process received ------------------

def _streamed_digests(world_size: int, rank: int) -> set:
    """``ops_digest`` of each op's last streamed form, as the test process received it, for each live world of
    this size (worlds of one size differ by their sandbox, e.g. the memory limit: the last call used one)."""
    from harness import pool
    return {_streamed_digest(w, rank) for key, w in pool._WORLDS.items() if key[:3] == (world_size, "gloo", None)}


def _streamed_digest(world, rank: int) -> str:
    from harness.record.policy import ops_digest
    last = {}
    for event in world.records[rank].raw_events():
        if event.get("ev") in ("issue", "wait", "done"):
            last[event["i"]] = event["op"]
    return ops_digest([last[i] for i in sorted(last)])


def honest_ops_then_the_recorders_digest():
    from harness.record.recorder import active
    run_calls(["all_reduce", "isend_irecv", "functional_all_reduce", "all_to_all_single_uneven"], False, True)
    return active().digest()


def test_the_recorders_digest_matches_the_stream_for_honest_code():
    """What lets the test process trust the rank's op-count check: the records it reads are the streamed ones."""
    digests = harness.run(honest_ops_then_the_recorders_digest, 2, timeout=30, probes=[harness.Compute()]).values
    assert all(digests[rank] in _streamed_digests(2, rank) for rank in range(2)), digests


def make_room_for_an_untraced_op():
    """Rename a traced all_reduce as a list reduce_scatter (gloo counts it twice on 2 ranks), then run one
    all_reduce the tracer cannot see: the counters balance, and the test process never hears of it."""
    from harness.record.recorder import active
    dist.all_reduce(torch.ones(2))
    active().ops[0]["name"] = "c10d.reduce_scatter_.default"
    untraced_all_reduce(None)
    return active().digest()


def test_renaming_a_record_to_make_room_for_an_untraced_op_shows_in_the_digest():
    try:
        digests = harness.run(make_room_for_an_untraced_op, 2, timeout=30).values
    except harness.TraceTampered:
        return   # the test process compares the digests itself: what this test asks for
    assert all(digests[rank] not in _streamed_digests(2, rank) for rank in range(2))


def test_renaming_a_record_to_make_room_for_an_untraced_op_is_caught():
    with pytest.raises(harness.TraceTampered):
        harness.run(make_room_for_an_untraced_op, 2, timeout=30)
