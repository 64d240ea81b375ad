"""harness.run: return values, exceptions in plain words, world sizes, the reused pool, defaults."""
import dataclasses
import os
import time

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import harness
from harness import pool
from tests.harness_helpers import assert_fresh_world_works, pids, sum_of_ranks

THIS_FILE = os.path.abspath(__file__)


# ---- return values ------------------------------------------------------------------------------

def describe_rank(scale, offset=0):
    rank, n = dist.get_rank(), dist.get_world_size()
    return {"rank": rank, "world": n, "tensor": torch.arange(3) * scale + rank + offset,
            "threads": torch.get_num_threads(), "backend": dist.get_backend()}


def test_each_rank_returns_its_own_value_with_args_and_kwargs():
    values, trace = harness.run(describe_rank, 3, 10, offset=100, timeout=30)
    assert [v["rank"] for v in values] == [0, 1, 2]
    assert all(v["world"] == 3 and v["threads"] == 1 and v["backend"] == "gloo" for v in values)
    for r, v in enumerate(values):
        assert torch.equal(v["tensor"], torch.arange(3) * 10 + r + 100)
    assert trace.world_size == 3 and trace.ops() == []


def test_run_result_has_named_fields():
    result = harness.run(sum_of_ranks, 2, timeout=30)
    assert isinstance(result, harness.RunResult)
    assert result.values == [1.0, 1.0]
    assert [op.kind for op in result.trace.ops(0)] == ["all_reduce"]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_world_sizes(world_size):
    values, trace = harness.run(sum_of_ranks, world_size, timeout=30)
    assert values == [world_size * (world_size - 1) / 2] * world_size
    assert all(op.group == tuple(range(world_size)) for op in trace.ops())
    assert len(trace.ops(kind="all_reduce")) == world_size


def test_world_size_out_of_range_is_refused():
    with pytest.raises(ValueError, match="world_size"):
        harness.run(sum_of_ranks, 0)


def test_auto_backend_is_gloo_without_enough_gpus():
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs: auto picks NCCL (exercised only on a GPU machine)")
    assert harness.pick_backend(2) == "gloo"
    with pytest.raises(harness.BackendUnavailable, match="NCCL needs one GPU per rank"):
        harness.pick_backend(2, "nccl")


@settings(max_examples=10, database=None)
@given(st.lists(st.integers(-1000, 1000), min_size=1, max_size=6))
def test_hypothesis_draws_in_the_caller_and_ranks_evaluate(xs):
    def scaled_sum(values):
        t = torch.tensor(values, dtype=torch.int64) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return t.tolist()
    values, _ = harness.run(scaled_sum, 2, xs, timeout=30)
    assert values == [[3 * x for x in xs]] * 2


# ---- the pool -----------------------------------------------------------------------------------

def test_the_same_rank_processes_serve_consecutive_calls():
    first = pids(2)
    for _ in range(3):
        assert pids(2) == first
    assert set(first) <= set(pool.live_rank_pids())
    assert len(set(first)) == 2 and os.getpid() not in first


def test_worlds_of_different_sizes_coexist():
    two, three = pids(2), pids(3)
    assert pids(2) == two and pids(3) == three and not set(two) & set(three)


def test_calls_are_fast_once_warm():
    pids(2)
    start = time.perf_counter()
    for _ in range(20):
        harness.run(sum_of_ranks, 2, timeout=30)
    assert (time.perf_counter() - start) / 20 < 0.25   # generous: ~2-5 ms here, the bench measures it


# ---- exceptions ---------------------------------------------------------------------------------

def _helper_that_raises(x):
    raise ValueError(f"bad input {x}")


def raise_on_rank_1():
    if dist.get_rank() == 1:
        _helper_that_raises(42)
    t = torch.ones(1)
    dist.all_reduce(t)   # rank 0 is left waiting here until the harness releases it
    return t.item()


def test_exception_names_rank_and_trims_traceback_to_code_under_test():
    before = pids(2)
    start = time.monotonic()
    with pytest.raises(harness.RankError) as info:
        harness.run(raise_on_rank_1, 2, timeout=5)
    assert time.monotonic() - start < 3, "the waiting rank was not released promptly"
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError" and "bad input 42" in err.exc_message
    assert [f[2] for f in err.frames] == ["raise_on_rank_1", "_helper_that_raises"]
    assert all(os.path.abspath(f[0]) == THIS_FILE for f in err.frames), err.frames
    text = str(err)
    assert text.startswith("rank 1 raised ValueError: bad input 42") and err.render() == text
    assert "_helper_that_raises(42)" in text and "site-packages" not in text and "harness/" not in text
    # rank 0 was stuck inside all_reduce: its world is replaced, and the next call works
    assert_fresh_world_works(2, before)


def raise_on_every_rank_after_balanced_ops():
    t = torch.ones(1)
    dist.all_reduce(t)
    raise KeyError(f"rank {dist.get_rank()}")


def test_lowest_rank_reported_when_all_raise():
    with pytest.raises(harness.RankError) as info:
        harness.run(raise_on_every_rank_after_balanced_ops, 3, timeout=5)
    assert info.value.rank == 0 and info.value.exc_type == "KeyError"
    assert harness.run(sum_of_ranks, 3, timeout=30).values == [3.0] * 3


def stub():
    raise NotImplementedError("fill me in")


def test_not_implemented_names_the_stub_location():
    with pytest.raises(harness.NotImplementedYet) as info:
        harness.run(stub, 2, timeout=5)
    line = stub.__code__.co_firstlineno + 1
    file = os.path.relpath(THIS_FILE) if not os.path.relpath(THIS_FILE).startswith("..") else THIS_FILE
    assert info.value.location == f"{file}:{line} (stub)"
    assert str(info.value) == f"not implemented yet: {file}:{line} (stub)"
    assert info.value.render().startswith("rank 0 raised NotImplementedError: fill me in\n")   # the whole report
    assert "raise NotImplementedError" in info.value.render()
    assert info.value.rank == 0   # a BaseException on purpose: hypothesis stops at once on a stub


def return_a_generator():
    return (i for i in range(3))


def test_unsendable_return_value_is_an_error_not_a_hang():
    with pytest.raises(harness.RankError, match="cannot be sent back"):
        harness.run(return_a_generator, 2, timeout=5)
    assert harness.run(sum_of_ranks, 2, timeout=30).values == [1.0, 1.0]


# ---- state a call can leave behind --------------------------------------------------------------

def tutorial_cleanup():
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()   # what every mp.spawn tutorial ends with
    return t.item()


def test_destroying_the_default_group_fails_clearly_and_the_world_is_replaced():
    before = pids(2)
    with pytest.raises(harness.RankError, match="destroyed or replaced the default process group"):
        harness.run(tutorial_cleanup, 2, timeout=10)
    assert_fresh_world_works(2, before)


def leave_a_group_behind():
    group = dist.new_group([0, 1])
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    return t.item(), os.getpid(), len(os.listdir("/proc/self/fd"))


def test_groups_left_behind_do_not_pile_up_in_a_pooled_world():
    results = [harness.run(leave_a_group_behind, 2, timeout=30).values for _ in range(45)]
    assert all(v == 2.0 for values in results for v, _, _ in values)
    assert len({pid for values in results for _, pid, _ in values}) > 2, "the world was never replaced"
    assert max(fds for values in results for _, _, fds in values) < 400   # each kept group holds ~5 fds per rank


def test_unpicklable_arguments_are_a_clear_error_in_the_caller():
    before = pids(2)
    with pytest.raises(TypeError, match="harness.run cannot send describe_rank and its arguments to the ranks"):
        harness.run(describe_rank, 2, (i for i in range(3)), timeout=10)
    assert pids(2) == before   # nothing was sent: the world is kept


# ---- defaults: what a call leaves out -----------------------------------------------------------

def test_defaults_apply_to_calls_in_the_block_and_nest():
    with harness.defaults(forbid={"all_reduce"}, timeout=10) as outer:
        assert outer == harness.RunDefaults(forbid=("all_reduce",), timeout=10)
        with pytest.raises(harness.ForbiddenOp, match="all_reduce is not allowed"):
            harness.run(sum_of_ranks, 2)
        assert harness.run(sum_of_ranks, 2, forbid=()).values == [1.0, 1.0]   # a call's own argument wins
        with harness.defaults(stop_on_hang=True) as inner:   # fields not given keep the outer block's
            assert inner.forbid == ("all_reduce",) and inner.timeout == 10 and inner.stop_on_hang
        with harness.defaults(forbid=()):
            assert harness.run(sum_of_ranks, 2).values == [1.0, 1.0]
    assert harness.run(sum_of_ranks, 2, timeout=30).values == [1.0, 1.0]   # gone after the block


def test_defaults_are_frozen_and_refuse_unknown_fields():
    with pytest.raises(TypeError):
        with harness.defaults(time_limit=3):
            pass
    with pytest.raises(dataclasses.FrozenInstanceError):
        harness.RunDefaults().timeout = 3


def test_on_trace_receives_each_successful_calls_trace():
    seen = []
    with harness.defaults(on_trace=seen.append, timeout=30):
        result = harness.run(sum_of_ranks, 2)
        with pytest.raises(harness.RankError):
            harness.run(raise_on_every_rank_after_balanced_ops, 2)
    harness.run(sum_of_ranks, 2, timeout=30)
    assert seen == [result.trace]


def _draw_and_load(target):
    """A fresh random number each time it runs, and the target file's answer."""
    return os.urandom(8).hex(), target.load().ANSWER


def _fails_sometimes(fail):
    if fail:
        raise ValueError("no")
    return os.urandom(8).hex()


def test_reuse_returns_an_identical_calls_result_without_running_it(tmp_path):
    """#14: properties that check one run share it; an edited file, other arguments or a failure run afresh."""
    learner = tmp_path / "mine.py"
    learner.write_text("ANSWER = 1\n")
    target = harness.Target(str(learner))
    first = harness.run(_draw_and_load, 2, target, reuse=True)
    again = harness.run(_draw_and_load, 2, target, reuse=True)
    assert again.values == first.values and again.trace is first.trace
    again.values[0] = "changed by a test"
    assert harness.run(_draw_and_load, 2, target, reuse=True).values == first.values   # each gets its own copy
    assert harness.run(_draw_and_load, 2, target).values != first.values               # reuse is asked for
    assert harness.run(_draw_and_load, 3, target, reuse=True).values[0] != first.values[0]
    time.sleep(0.01)
    learner.write_text("ANSWER = 22\n")
    edited = harness.run(_draw_and_load, 2, target, reuse=True).values
    assert edited != first.values and edited[0][1] == 22
    with pytest.raises(harness.RankError):
        harness.run(_fails_sometimes, 1, True, reuse=True)
    with pytest.raises(harness.RankError):   # a failure is not kept
        harness.run(_fails_sometimes, 1, True, reuse=True)
    harness.shutdown()   # a new session forgets what was kept
    assert harness.run(_draw_and_load, 2, target, reuse=True).values != edited


def _square_matmul(n):
    q = torch.ones(n, 8, device=harness.device())
    return (q @ q.T).shape[0]


def test_count_flops_is_measured_on_each_rank_by_the_harness():
    """#17: balance properties read FLOPs the harness counted around the rank function, not numbers the code reports."""
    result = harness.run(_square_matmul, 2, harness.per_rank([4, 8]), probes=[harness.Flops()])
    assert result.flops == [2 * 4 * 8 * 4, 2 * 8 * 8 * 8]
    assert harness.run(_square_matmul, 2, 4).flops is None   # only when asked


def _random_tag(x):
    return os.urandom(8).hex(), float(x.sum())


def test_reuse_knows_equal_tensors_drawn_afresh():
    """Each hypothesis example builds its tensors anew: equal contents must name the same call."""
    first = harness.run(_random_tag, 2, torch.arange(6.0), reuse=True).values
    assert harness.run(_random_tag, 2, torch.arange(6.0), reuse=True).values == first
    assert harness.run(_random_tag, 2, torch.arange(6.0) + 1, reuse=True).values != first


def test_a_world_works_when_the_test_process_holds_descriptors_past_fd_setsize():
    """A test process that has run many worlds holds more than 1024 descriptors (select.select's FD_SETSIZE):
    the reply pipes, the file witness and the traffic witness of a world made then are waited on all the same."""
    harness.shutdown()   # the next world is made now, its descriptors above the ones held here
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert harness.run(sum_of_ranks, 3).values == [3.0] * 3
    finally:
        harness.shutdown()   # no later test gets this world
        for fd in held:
            os.close(fd)
