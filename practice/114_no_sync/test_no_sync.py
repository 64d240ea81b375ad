"""Problem 114 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); expected values come from
single-process training in the test process, and what was communicated from the
harness's trace.
"""
import torch
import torch.distributed as dist
from hypothesis import example, given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.models import OptimizerSpec, mse, random_batches, random_mlp, shard, train_reference


@st.composite
def accumulation_cases(draw):
    return dict(world_size=draw(hs.world_sizes()), widths=draw(hs.mlp_widths(max_layers=3)),
                k=draw(st.integers(1, 4)), micro=draw(st.integers(1, 3)), steps=draw(st.integers(1, 2)),
                optimizer=draw(hs.optimizers()), seed=draw(hs.seeds()))


def global_batches(case):
    """The full batch of every step: world_size ranks x k micro-batches x ``micro`` rows."""
    return random_batches(case["steps"], case["world_size"] * case["k"] * case["micro"], case["widths"][0],
                          case["widths"][-1], case["seed"] + 1)


def micro_batches(x, y, rank, world, k):
    """This rank's shard of a global batch, cut into k equal micro-batches."""
    return list(zip(shard(x, rank, world).tensor_split(k), shard(y, rank, world).tensor_split(k)))


def _wrap(target, widths, seed):
    """On a rank: a model with a rank-specific init (the wrapper's broadcast must fix that), wrapped."""
    model = random_mlp(widths, seed + 7919 * dist.get_rank())
    with harness.phase("construct"):
        return model, target.load().AccumulatingDDP(model)


def _plain_backward(ddp, x, y):
    """One backward outside no_sync, in phase "plain": the trace shows what a single sync costs."""
    with harness.phase("plain"):
        mse(ddp(x), y).backward()


def one_sync(trace, rank):
    ops = trace.ops(rank, phase="plain")
    return len(ops), sum(op.in_bytes for op in ops)


# ---- train_step ----------------------------------------------------------------------------------

def _train(target, widths, k, micro, steps, optimizer, seed):
    """Runs on every rank: one plain backward (the cost of a sync), then ``steps`` train_steps."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, ddp = _wrap(target, widths, seed)
    opt = optimizer.build(model.parameters())
    batches = random_batches(steps, world_size * k * micro, widths[0], widths[-1], seed + 1)
    x, y = micro_batches(*batches[0], rank, world_size, k)[0]
    _plain_backward(ddp, x, y)   # leaves gradients behind: train_step must zero them first
    history, losses = [], []
    for step, (x, y) in enumerate(batches):
        with harness.phase("train_step", step=step):
            losses.append(target.load().train_step(ddp, opt, micro_batches(x, y, rank, world_size, k), mse))
        history.append([p.detach().clone() for p in model.parameters()])
    return {"history": history, "losses": losses}


def _run_train(target, case):
    return harness.run(_train, case["world_size"], target, **{k: v for k, v in case.items() if k != "world_size"})


def _describe(case):
    return (f"{case['steps']} train_step call(s) on {case['world_size']} rank(s), k={case['k']} micro-batch(es) of "
            f"{case['micro']} row(s) each, {case['optimizer']}")


@hs.fewer_examples(0.6)
@given(accumulation_cases())
@example(dict(world_size=3, widths=[3, 4, 2], k=3, micro=2, steps=2, optimizer=OptimizerSpec("SGD", {"lr": 0.1}),
              seed=0))
def test_train_step_matches_single_process(target, case):
    values, _ = _run_train(target, case)
    model = random_mlp(case["widths"], case["seed"])
    expected = train_reference(model, global_batches(case), case["optimizer"])
    names = [n for n, _ in model.named_parameters()]
    for rank, out in enumerate(values):
        for step, (got_params, want_params) in enumerate(zip(out["history"], expected)):
            for name, got, want in zip(names, got_params, want_params):
                harness.assert_close(got, want, f"{_describe(case)}: parameter {name}, compared with one "
                                     "single-process step on the whole global batch", rank=rank, step=step,
                                     atol=1e-9, rtol=1e-7)


@hs.fewer_examples(0.6)
@given(accumulation_cases())
def test_train_step_returns_mean_loss(target, case):
    values, _ = _run_train(target, case)
    model = random_mlp(case["widths"], case["seed"])
    before = [[p.detach().clone() for p in model.parameters()]]
    before += train_reference(random_mlp(case["widths"], case["seed"]), global_batches(case), case["optimizer"])
    for step, (x, y) in enumerate(global_batches(case)):
        with torch.no_grad():
            for p, value in zip(model.parameters(), before[step]):
                p.copy_(value)
            for rank, out in enumerate(values):
                got = out["losses"][step]
                pieces = micro_batches(x, y, rank, case["world_size"], case["k"])
                want = sum(mse(model(xm), ym).item() for xm, ym in pieces) / case["k"]
                harness.check(type(got) is float, f"train_step returned {got!r} ({type(got).__name__}); it must "
                              "return a Python float (loss.item())", rank=rank, step=step)
                harness.check(abs(got - want) <= 1e-9 + 1e-7 * abs(want),
                              f"{_describe(case)}: train_step returned {got!r}, but the mean of this rank's "
                              f"{case['k']} unscaled micro-batch losses is {want!r}", rank=rank, step=step)


@hs.fewer_examples(0.6)
@given(accumulation_cases())
def test_one_sync_per_step(target, record_property, case):
    _, trace = _run_train(target, case)
    params = list(random_mlp(case["widths"], 0).parameters())
    model_bytes = sum(p.numel() * p.element_size() for p in params)   # P · elem_size: every gradient once
    for rank in range(case["world_size"]):
        count, size = one_sync(trace, rank)
        if case["world_size"] > 1:   # on one rank there is nothing to average: a sync may skip its ops
            harness.check(size == model_bytes,
                          f"one plain backward outside no_sync() communicated {size} bytes, but bytes per rank in "
                          f"the cost model is P · elem_size = {model_bytes}: every gradient once, averaged",
                          rank=rank)
            harness.check(1 <= count <= len(params),
                          f"one plain backward outside no_sync() issued {count} communication ops, but messages per "
                          f"rank in the cost model is between 1 and n_params = {len(params)}: one flat all-reduce, "
                          "or one per parameter", rank=rank)
        for step in range(case["steps"]):
            ops = trace.ops(rank, phase="train_step", step=step)
            sent = sum(op.in_bytes for op in ops)
            harness.check((len(ops), sent) == (count, size),
                          f"{_describe(case)}: this step issued {len(ops)} communication ops carrying {sent} bytes, "
                          f"but one synchronised backward costs {count} ops and {size} bytes. Exactly one of the "
                          f"{case['k']} backward passes (the last) may communicate; the others run inside no_sync()",
                          rank=rank, step=step)
    last = trace.ops(0, phase="train_step", step=case["steps"] - 1)
    cost.record(record_property, f"train_step of k={case['k']} micro-batches, {len(params)} parameters on "
                f"{case['world_size']} ranks", model_bytes * case["k"] if case["world_size"] > 1 else -1,
                bytes_per_rank=(model_bytes, sum(op.in_bytes for op in last)),
                messages_per_rank=(one_sync(trace, 0)[0], len(last)))


# ---- no_sync itself ------------------------------------------------------------------------------

@st.composite
def sync_cases(draw):
    return dict(world_size=draw(hs.world_sizes()), widths=draw(hs.mlp_widths(max_layers=3)),
                k=draw(st.integers(2, 4)), seed=draw(hs.seeds()))


def _accumulate(target, widths, k, seed):
    """Runs on every rank: k-1 backward passes inside no_sync, one outside; the gradients after each."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model, ddp = _wrap(target, widths, seed)
    (x, y), = random_batches(1, world_size * k, widths[0], widths[-1], seed + 1)
    pieces = micro_batches(x, y, rank, world_size, k)
    for j, (xm, ym) in enumerate(pieces[:-1]):
        with ddp.no_sync():
            with harness.phase("no_sync", step=j):
                mse(ddp(xm), ym).backward()
    local = [p.grad.clone() for p in model.parameters()]
    with harness.phase("sync"):
        mse(ddp(pieces[-1][0]), pieces[-1][1]).backward()
    return {"local": local, "synced": [p.grad.clone() for p in model.parameters()]}


def expected_grads(case):
    """Single-process: each rank's k-1 local accumulated gradients, and the average over ranks of all k."""
    model = random_mlp(case["widths"], case["seed"])
    (x, y), = random_batches(1, case["world_size"] * case["k"], case["widths"][0], case["widths"][-1],
                             case["seed"] + 1)
    local = []
    for rank in range(case["world_size"]):
        model.zero_grad()
        pieces = micro_batches(x, y, rank, case["world_size"], case["k"])
        for xm, ym in pieces[:-1]:
            mse(model(xm), ym).backward()
        local.append([p.grad.clone() for p in model.parameters()])
    model.zero_grad()
    total = sum(mse(model(xm), ym) for rank in range(case["world_size"])
                for xm, ym in micro_batches(x, y, rank, case["world_size"], case["k"]))
    (total / case["world_size"]).backward()
    return [n for n, _ in model.named_parameters()], local, [p.grad.clone() for p in model.parameters()]


@given(sync_cases())
def test_no_collectives_inside_no_sync(target, case):
    values, trace = harness.run(_accumulate, case["world_size"], target, case["widths"], case["k"], case["seed"])
    names, local, synced = expected_grads(case)
    k = case["k"]
    for rank, out in enumerate(values):
        for j in range(k - 1):
            ops = trace.ops(rank, phase="no_sync", step=j)
            harness.check(not ops, f"backward pass {j + 1} of {k}, inside no_sync(), issued {len(ops)} communication "
                          f"ops ({ops[0].describe() if ops else ''}): inside no_sync() backward must not communicate",
                          rank=rank)
        for name, got, want in zip(names, out["local"], local[rank]):
            harness.assert_close(got, want, f"{name}.grad after {k - 1} backward passes inside no_sync() (the sum "
                                 "of this rank's own gradients, not averaged)", rank=rank, atol=1e-9, rtol=1e-7)
        harness.check(trace.ops(rank, phase="sync"), "the backward pass after no_sync() communicated nothing: it "
                      "must average the accumulated gradients", rank=rank)
        for name, got, want in zip(names, out["synced"], synced):
            harness.assert_close(got, want, f"{name}.grad after the backward pass that follows no_sync() (the "
                                 f"average over ranks of all {k} accumulated gradients)", rank=rank,
                                 atol=1e-9, rtol=1e-7)


def _exception_inside(target, widths, seed):
    """Runs on every rank: an exception escapes a no_sync block; then a backward that must sync."""
    model, ddp = _wrap(target, widths, seed)
    x, y = random_batches(1, 2, widths[0], widths[-1], seed + 1)[0]
    _plain_backward(ddp, x, y)
    propagated = False
    try:
        with ddp.no_sync():
            raise KeyError("raised inside no_sync")
    except KeyError:
        propagated = True
    with harness.phase("after"):
        mse(ddp(x), y).backward()
    return propagated


@given(sync_cases())
def test_state_restored_after_exception(target, case):
    values, trace = harness.run(_exception_inside, case["world_size"], target, case["widths"], case["seed"])
    for rank, propagated in enumerate(values):
        harness.check(propagated, "an exception raised inside `with ddp.no_sync():` did not reach the caller: "
                      "no_sync must not swallow exceptions", rank=rank)
        ops = trace.ops(rank, phase="after")
        harness.check(len(ops) == one_sync(trace, rank)[0],
                      f"after an exception left a no_sync() block, the next backward issued {len(ops)} communication "
                      f"ops instead of the {one_sync(trace, rank)[0]} of a normal backward: no_sync must restore "
                      "the previous setting even when the block raises (try/finally)", rank=rank)


def _nested(target, widths, seed):
    """Runs on every rank: backward inside an outer no_sync after an inner one closed, then after both."""
    model, ddp = _wrap(target, widths, seed)
    x, y = random_batches(1, 2, widths[0], widths[-1], seed + 1)[0]
    _plain_backward(ddp, x, y)
    with ddp.no_sync():
        with ddp.no_sync():
            with harness.phase("inner"):
                mse(ddp(x), y).backward()
        with harness.phase("outer"):
            mse(ddp(x), y).backward()
    with harness.phase("after"):
        mse(ddp(x), y).backward()


@given(sync_cases())
def test_nested_no_sync(target, case):
    _, trace = harness.run(_nested, case["world_size"], target, case["widths"], case["seed"])
    for rank in range(case["world_size"]):
        for phase, where in (("inner", "inside two nested no_sync() blocks"),
                             ("outer", "inside the outer no_sync() block, after the inner one closed")):
            ops = trace.ops(rank, phase=phase)
            harness.check(not ops, f"a backward {where} issued {len(ops)} communication ops: closing a nested "
                          "no_sync() must restore the previous setting (still no sync), not switch sync back on",
                          rank=rank)
        ops = trace.ops(rank, phase="after")
        harness.check(len(ops) == one_sync(trace, rank)[0],
                      f"after both no_sync() blocks closed, a backward issued {len(ops)} communication ops instead "
                      f"of the {one_sync(trace, rank)[0]} of a normal backward", rank=rank)
