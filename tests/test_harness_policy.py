"""Forbidden ops are caught on every path to a collective; bypassing the tracer is caught too."""
import pytest
import torch
import torch.distributed as dist

import harness
from tests.harness_helpers import assert_fresh_world_works, pids, sum_of_ranks

NO_ALL_REDUCE = {"forbid": {"all_reduce"}, "timeout": 10}


# ---- every way to call all_reduce ---------------------------------------------------------------

def via_dist():
    dist.all_reduce(torch.ones(2))


def via_from_import():
    from torch.distributed import all_reduce
    all_reduce(torch.ones(2))


def via_distributed_c10d():
    torch.distributed.distributed_c10d.all_reduce(torch.ones(2))


def via_process_group_method():
    dist.group.WORLD.allreduce([torch.ones(2)]).wait()


def via_async_work():
    dist.all_reduce(torch.ones(2), async_op=True).wait()


def via_functional_collective():
    import torch.distributed._functional_collectives as funcol
    funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).wait()


def via_ddp_reducer():
    # init_sync=False: no construction broadcast, so only the reducer's own all_reduce in backward can trip
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2), init_sync=False)
    model(torch.ones(4, 3)).sum().backward()


@pytest.mark.parametrize("fn", [via_dist, via_from_import, via_distributed_c10d, via_process_group_method,
                                via_async_work, via_functional_collective, via_ddp_reducer],
                         ids=lambda f: f.__name__)
def test_forbidden_all_reduce_is_caught_on_every_path(fn):
    with pytest.raises(harness.ForbiddenOp) as info:
        harness.run(fn, 2, **NO_ALL_REDUCE)
    assert str(info.value).startswith("rank 0: all_reduce is not allowed in this problem (called at ")
    assert "test_harness_policy.py:" in str(info.value)


def test_the_backend_object_cannot_be_called_directly_even_when_nothing_is_forbidden():
    def via_backend():
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        backend.allreduce([torch.ones(2)]).wait()
    with pytest.raises(harness.ForbiddenOp, match=r"allreduce\(\) was called on a Backend object directly"):
        harness.run(via_backend, 2, timeout=10)


def test_ddp_own_collectives_are_caught():
    def ddp_step():
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
        model(torch.ones(4, 3)).sum().backward()
    with pytest.raises(harness.ForbiddenOp, match="broadcast is not allowed"):   # construction's broadcast
        harness.run(ddp_step, 2, forbid={"all_reduce", "broadcast"}, timeout=20)
    values, trace = harness.run(ddp_step, 2, timeout=20)   # allowed: the harness sees what DDP sent
    assert {"broadcast", "all_reduce"} <= set(trace.kinds(0))


def test_zero_redundancy_optimizer_collectives_are_caught():
    def zero_step():
        from torch.distributed.optim import ZeroRedundancyOptimizer
        model = torch.nn.Linear(3, 2)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
    with pytest.raises(harness.ForbiddenOp, match="broadcast is not allowed"):
        harness.run(zero_step, 2, forbid={"broadcast"}, timeout=20)


def swallow_the_refusal():
    try:
        dist.all_reduce(torch.ones(2))
    except Exception:
        pass
    return "got away with it"


def swallow_it_inside_ddp():
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2), init_sync=False)
    try:
        model(torch.ones(4, 3)).sum().backward()
    except Exception:
        pass


@pytest.mark.parametrize("fn", [swallow_the_refusal, swallow_it_inside_ddp], ids=lambda f: f.__name__)
def test_catching_forbidden_op_does_not_hide_it(fn):
    with pytest.raises(harness.ForbiddenOp, match="all_reduce is not allowed"):
        harness.run(fn, 2, **NO_ALL_REDUCE)


def gather_into_tensor():
    out = torch.empty(2 * dist.get_world_size())
    dist.all_gather_into_tensor(out, torch.ones(2))
    return out.tolist()


def test_all_gather_into_tensor_is_one_op_and_forbidden_as_all_gather():
    values, trace = harness.run(gather_into_tensor, 2, timeout=10)
    assert values == [[1.0] * 4] * 2
    assert trace.kinds(0) == ["all_gather"] and trace.kinds(1) == ["all_gather"]
    op = trace.ops(0)[0]
    assert op.in_bytes == 8 and op.out_bytes == 16
    with pytest.raises(harness.ForbiddenOp, match="all_gather is not allowed"):
        harness.run(gather_into_tensor, 2, forbid={"all_gather"}, timeout=10)


def test_allow_list_names_what_is_allowed_instead():
    with pytest.raises(harness.ForbiddenOp) as info:
        harness.run(via_dist, 2, allow={"send", "recv"}, timeout=10)
    assert "all_reduce is not allowed" in str(info.value) and "Allowed here: recv, send." in str(info.value)


def test_other_ops_stay_allowed_and_the_world_is_reused_after_a_forbidden_op():
    before = pids(2)
    with pytest.raises(harness.ForbiddenOp):
        harness.run(via_dist, 2, **NO_ALL_REDUCE)
    values, trace = harness.run(gather_into_tensor, 2, **NO_ALL_REDUCE)
    assert trace.kinds(0) == ["all_gather"]
    # forbid is per call: the next call without it may all_reduce again
    assert harness.run(sum_of_ranks, 2, timeout=10).values == [1.0, 1.0]
    assert pids(2) == before   # a refused op never reached gloo: nothing in flight, the world is kept


# ---- bypassing the tracer -----------------------------------------------------------------------

def inference_mode_tensor():
    with torch.inference_mode():
        t = torch.ones(2)
        dist.all_reduce(t)
    return t.tolist()


def replace_the_c10d_kernel(allow_override: bool):
    import inspect
    c10d_ops = getattr(torch, "ops").c10d   # (cloudpickle 2.1 cannot ship a function that names torch.ops)
    original = c10d_ops.allreduce_.default

    def untraced(*args, **kwargs):
        with torch._C._AutoDispatchBelowAutograd():
            return original(*args, **kwargs)
    lib = torch.library.Library("c10d", "IMPL")
    asks = "allow_override" in inspect.signature(lib.impl).parameters
    lib.impl("allreduce_", untraced, "AutogradCPU", **({"allow_override": allow_override} if asks else {}))
    replace_the_c10d_kernel.keep = lib
    t = torch.ones(2)
    dist.all_reduce(t)
    return t.tolist()


def replaced_c10d_kernel():
    return replace_the_c10d_kernel(allow_override=True)   # an attacker asks for the override where torch offers one


def replaced_c10d_kernel_without_asking():
    return replace_the_c10d_kernel(allow_override=False)   # what torch < 2.12 does by default: it refuses


# Replacing the tracer's kernel has two safe outcomes, depending on torch: some versions refuse a second
# Python kernel for the same op and key (the rank raises that RuntimeError), the others run the
# replacement and the op counters expose the untraced all_reduce.
TORCH_REFUSES_A_SECOND_KERNEL = "already a kernel registered from python overriding allreduce_"


@pytest.mark.parametrize("fn", [inference_mode_tensor, replaced_c10d_kernel, replaced_c10d_kernel_without_asking],
                         ids=lambda f: f.__name__)
def test_bypassing_the_tracer_is_caught(fn):
    before = pids(2)
    with pytest.raises((harness.TraceTampered, harness.RankError)) as info:
        harness.run(fn, 2, timeout=10)
    if isinstance(info.value, harness.RankError):
        assert fn is not inference_mode_tensor, str(info.value)
        assert info.value.exc_type == "RuntimeError" and TORCH_REFUSES_A_SECOND_KERNEL in info.value.exc_message
        return   # nothing ran untraced: torch stopped it before any op
    assert "ran 1 communication ops but the harness traced 0" in str(info.value)
    assert_fresh_world_works(2, before)   # a tampered world is never reused


def test_an_unknown_op_kind_in_a_policy_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown op kind.*'allreduce'"):
        harness.run(via_dist, 2, forbid={"allreduce"}, timeout=10)
    with pytest.raises(ValueError, match="'isend'"):
        harness.run(via_dist, 2, allow={"isend"}, timeout=10)
