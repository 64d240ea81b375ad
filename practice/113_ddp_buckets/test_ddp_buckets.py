"""Problem 113 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); expected values and every
assertion live here, in the test process.
"""
import math

import torch
import torch.distributed as dist
from hypothesis import assume, given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.models import grad_bytes, mse, random_batches, random_mlp, shard, train_reference


# ---- make_buckets -------------------------------------------------------------------------------

def _make_buckets(target, cases):
    return [target.load().make_buckets(sizes, cap) for sizes, cap in cases]


def check_bucket_contract(sizes, cap, buckets, what="make_buckets"):
    """The four rules that pin the greedy bucketing down exactly."""
    call = f"{what}(sizes={sizes}, cap={cap}) returned {buckets}"
    flat = [i for b in buckets for i in b]
    harness.check(sorted(flat) == list(range(len(sizes))), f"{call}: every parameter index must appear exactly once")
    harness.check(all(b for b in buckets), f"{call}: no bucket may be empty")
    harness.check(flat == sorted(flat, reverse=True),
                  f"{call}: buckets must be filled walking from the LAST parameter to the first")
    for b in buckets:
        harness.check(len(b) == 1 or sum(sizes[i] for i in b) <= cap,
                      f"{call}: bucket {b} holds {sum(sizes[i] for i in b)} bytes > cap {cap} "
                      "(only a single oversize parameter may exceed the cap)")
    for b, nxt in zip(buckets, buckets[1:]):
        harness.check(sum(sizes[i] for i in b) + sizes[nxt[0]] > cap,
                      f"{call}: bucket {b} was closed although parameter {nxt[0]} still fit under the cap")


STATEMENT_EXAMPLES = [([4, 4, 4, 4], 8, [[3, 2], [1, 0]]), ([1, 2, 3, 4], 5, [[3], [2, 1], [0]]),
                      ([2, 20, 2], 5, [[2], [1], [0]]), ([], 5, [])]


# The statement's examples ride along with random cases, so hard-coding them earns nothing.
@given(sizes=st.lists(st.integers(0, 64), max_size=12), cap=st.integers(1, 96))
def test_bucket_contract(target, sizes, cap):
    *examples, buckets = harness.run(_make_buckets, 1, target,
                                     [(s, c) for s, c, _ in STATEMENT_EXAMPLES] + [(sizes, cap)]).values[0]
    for (ex_sizes, ex_cap, expected), got in zip(STATEMENT_EXAMPLES, examples):
        call = f"make_buckets({ex_sizes}, {ex_cap})"
        harness.expect_type(got, "list[list[int]]", call)
        harness.check(got == expected, f"{call} returned {got}, the statement's example says {expected}", case=call)
    harness.expect_type(buckets, "list[list[int]]", f"make_buckets({sizes}, {cap})")
    check_bucket_contract(sizes, cap, buckets)


# ---- comm_timeline and exposed_comm -------------------------------------------------------------

@st.composite
def timelines(draw):
    """Any partition of the parameters into ordered buckets, with ready times and link speed."""
    n = draw(st.integers(1, 8))
    sizes = draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    ready = draw(st.lists(st.floats(0, 10, allow_nan=False), min_size=n, max_size=n))
    order = draw(st.permutations(range(n)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
    buckets = [list(order[a:b]) for a, b in zip([0] + cuts, cuts + [n])]
    bw = draw(st.floats(0.5, 100))
    latency = draw(st.sampled_from([0.0, 0.25, 1.0]))
    return ready, buckets, sizes, bw, latency


def _timeline(target, ready, buckets, sizes, bw, latency):
    m = target.load()
    return {
        "spans": m.comm_timeline(ready, buckets, sizes, bw, latency),
        "exposed": m.exposed_comm(ready, buckets, sizes, bw, latency),
        "exposed_faster": m.exposed_comm(ready, buckets, sizes, bw * 2, latency),
        "one_bucket": m.exposed_comm(ready, [[i for b in buckets for i in b]], sizes, bw, latency),
    }


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@given(timelines())
def test_timeline(target, case):
    ready, buckets, sizes, bw, latency = case
    out = harness.run(_timeline, 1, target, *case).values[0]
    call = f"comm_timeline(ready={ready}, buckets={buckets}, sizes={sizes}, bw={bw}, latency={latency})"
    spans = harness.expect_type(out["spans"], "list[tuple[float, float]]", call)
    harness.check(len(spans) == len(buckets), f"{call}: returned {len(spans)} spans for {len(buckets)} buckets")
    prev_end = 0.0
    for k, (bucket, (start, end)) in enumerate(zip(buckets, spans)):
        last_ready = max(ready[i] for i in bucket)
        duration = latency + sum(sizes[i] for i in bucket) / bw
        harness.check(start >= last_ready - 1e-9,
                      f"{call}: bucket {k} starts at {start:g}, before its last gradient is ready at {last_ready:g}")
        harness.check(start >= prev_end - 1e-9,
                      f"{call}: bucket {k} starts at {start:g}, before bucket {k - 1} ends at {prev_end:g} "
                      "(one stream: buckets run one after another, in order)")
        harness.check(_close(start, max(last_ready, prev_end)),
                      f"{call}: bucket {k} starts at {start:g}, but the stream is free and its gradients ready "
                      f"at {max(last_ready, prev_end):g}")
        harness.check(_close(end - start, duration),
                      f"{call}: bucket {k} lasts {end - start:g}, expected latency + bytes/bw = {duration:g}")
        prev_end = end


@given(timelines())
def test_exposed_comm(target, case):
    ready, buckets, sizes, bw, latency = case
    out = harness.run(_timeline, 1, target, *case).values[0]
    call = f"exposed_comm(ready={ready}, buckets={buckets}, sizes={sizes}, bw={bw}, latency={latency})"
    exposed = harness.expect_type(out["exposed"], "float", call)
    spans = harness.expect_type(out["spans"], "list[tuple[float, float]]",
                                call.replace("exposed_comm", "comm_timeline", 1))
    harness.check(exposed >= 0, f"{call} = {exposed:g}: exposed communication is never negative")
    harness.check(_close(exposed, max(0.0, spans[-1][1] - max(ready))),
                  f"{call} = {exposed:g}, expected max(0, last end - last ready) = "
                  f"{max(0.0, spans[-1][1] - max(ready)):g}")
    last = buckets[-1]
    if max(ready[i] for i in last) == max(ready):
        duration = latency + sum(sizes[i] for i in last) / bw
        harness.check(exposed >= duration - 1e-9,
                      f"{call} = {exposed:g}: the last bucket holds the last-ready gradient, so at least its "
                      f"whole duration {duration:g} is exposed")
    total = latency + sum(sizes) / bw
    harness.check(_close(out["one_bucket"], total),
                  f"with one bucket nothing overlaps: exposed should be latency + all bytes/bw = {total:g}, "
                  f"got {out['one_bucket']:g}")
    harness.check(out["exposed_faster"] <= exposed + 1e-9,
                  f"{call}: doubling the bandwidth exposed more communication "
                  f"({out['exposed_faster']:g} > {exposed:g})")


# ---- BucketedDDP on real ranks ------------------------------------------------------------------

@st.composite
def ddp_cases(draw, micro_batches=st.just(1)):
    world_size = draw(hs.world_sizes())
    widths = draw(hs.mlp_widths(max_layers=3))
    n_params = 2 * (len(widths) - 1)
    frozen = draw(st.sets(st.integers(0, n_params - 1), max_size=n_params - 1))
    sizes = [s for i, s in enumerate(grad_bytes(random_mlp(widths, 0))) if i not in frozen]
    # from one parameter per bucket to one bucket for everything
    cap = draw(st.sampled_from([1, min(sizes), sum(sizes) // 2 or 1, max(sizes), sum(sizes)]))
    return dict(world_size=world_size, widths=widths, frozen=frozen, cap=cap,
                local_batch=draw(st.integers(1, 3)), steps=draw(st.integers(1, 3)),
                optimizer=draw(hs.optimizers()), seed=draw(hs.seeds()), micro_batches=draw(micro_batches))


def _ddp_train(target, widths, frozen, cap, local_batch, steps, optimizer, seed, micro_batches=1):
    """Runs on every rank: build from a rank-specific init, wrap, train, report params and buckets.

    Each step runs ``micro_batches`` backward passes, each followed by finish_gradient_sync(), without
    zero_grad between them, then one optimizer step.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model = random_mlp(widths, seed + 7919 * rank, frozen=frozen)
    same = random_mlp(widths, seed, frozen=frozen)
    with torch.no_grad():  # frozen parameters start equal on every rank (the contract asks no broadcast of them)
        for i, (p, q) in enumerate(zip(model.parameters(), same.parameters())):
            if i in frozen:
                p.copy_(q)
    with harness.phase("construct"):
        ddp = target.load().BucketedDDP(model, cap)
    opt = optimizer.build([p for p in model.parameters() if p.requires_grad])
    batches = random_batches(steps * micro_batches, local_batch * world, widths[0], widths[-1], seed + 1)
    history, grads = [], []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        for x, y in batches[step * micro_batches:(step + 1) * micro_batches]:
            loss = mse(ddp(shard(x, rank, world)), shard(y, rank, world))
            with harness.phase("backward", step=step):
                loss.backward()
            with harness.phase("finish", step=step):
                ddp.finish_gradient_sync()
        grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return {"history": history, "grads": grads, "buckets": [list(b) for b in ddp.buckets]}


def _run_ddp(target, case):
    """One training run per drawn case: the properties below check different things about the same run."""
    args = {k: v for k, v in case.items() if k != "world_size"}
    return harness.run(_ddp_train, case["world_size"], target, reuse=True, **args)


def _torch_ddp_train(widths, frozen, local_batch, steps, optimizer, seed, micro_batches):
    """torch's own DistributedDataParallel, trained exactly as _ddp_train trains BucketedDDP."""
    from torch.nn.parallel import DistributedDataParallel
    rank, world = dist.get_rank(), dist.get_world_size()
    model = random_mlp(widths, seed, frozen=frozen)   # rank 0's init in _ddp_train, which BucketedDDP broadcasts
    ddp = DistributedDataParallel(model)
    opt = optimizer.build([p for p in model.parameters() if p.requires_grad])
    batches = random_batches(steps * micro_batches, local_batch * world, widths[0], widths[-1], seed + 1)
    history, grads = [], []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        for x, y in batches[step * micro_batches:(step + 1) * micro_batches]:
            mse(ddp(shard(x, rank, world)), shard(y, rank, world)).backward()
        grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return {"history": history, "grads": grads}


@given(ddp_cases())
def test_ddp_matches_single_process_training(target, case):
    values, _ = _run_ddp(target, case)
    model = random_mlp(case["widths"], case["seed"], frozen=case["frozen"])
    batches = random_batches(case["steps"], case["local_batch"] * case["world_size"], case["widths"][0],
                             case["widths"][-1], case["seed"] + 1)
    expected = train_reference(model, batches, case["optimizer"])
    names = [n for n, _ in model.named_parameters()]
    for rank, out in enumerate(values):
        for step, (got_params, want_params) in enumerate(zip(out["history"], expected)):
            for name, got, want in zip(names, got_params, want_params):
                harness.assert_close(got, want, f"parameter {name} after {case['optimizer']}", rank=rank,
                                     step=step, atol=1e-9, rtol=1e-7)


@hs.fewer_examples(0.3)
@given(ddp_cases(micro_batches=st.integers(2, 3)))
def test_gradients_accumulate_across_backward_passes(target, case):
    values, _ = _run_ddp(target, case)
    k = case["micro_batches"]
    model = random_mlp(case["widths"], case["seed"], frozen=case["frozen"])
    names = [n for n, _ in model.named_parameters()]
    # k backward passes of the mean loss over micro-batches of equal size add up to the gradient of k times the
    # mean loss over all of them: one full batch per step
    batches = random_batches(case["steps"] * k, case["local_batch"] * case["world_size"], case["widths"][0],
                             case["widths"][-1], case["seed"] + 1)
    full_batches = [tuple(torch.cat(part) for part in zip(*batches[step * k:(step + 1) * k]))
                    for step in range(case["steps"])]
    expected = train_reference(model, full_batches, case["optimizer"], loss_fn=lambda out, y: k * mse(out, y))
    # trusted torch code: a longer limit covers DDP's construction (its own broadcasts and checks)
    oracle = harness.run(_torch_ddp_train, case["world_size"], case["widths"], case["frozen"], case["local_batch"],
                         case["steps"], case["optimizer"], case["seed"], k, timeout=60).values
    what = (f"{k} backward passes, each followed by finish_gradient_sync(), without zero_grad between them "
            f"({case['optimizer']}, {case['world_size']} rank{'s' if case['world_size'] > 1 else ''})")
    for rank, (out, torch_ddp) in enumerate(zip(values, oracle)):
        for step in range(case["steps"]):
            for name, got, want in zip(names, out["grads"][step], torch_ddp["grads"][step]):
                if want is None:   # frozen
                    continue
                harness.check(got is not None, f"parameter {name} has no .grad after {what}", rank=rank, step=step)
                harness.assert_close(got, want, f"gradient of {name} after {what}, against torch's "
                                     "DistributedDataParallel: each backward adds to .grad, and the hook must "
                                     "reduce the accumulated gradient, not only the new one", rank=rank, step=step,
                                     atol=1e-9, rtol=1e-7)
            for name, got, want in zip(names, out["history"][step], expected[step]):
                harness.assert_close(got, want, f"parameter {name} after one step on gradients from {what}, "
                                     "against single-process training", rank=rank, step=step, atol=1e-9, rtol=1e-7)


@given(ddp_cases())
def test_buckets_follow_make_buckets(target, case):
    values, _ = _run_ddp(target, case)
    sizes = [s for i, s in enumerate(grad_bytes(random_mlp(case["widths"], 0))) if i not in case["frozen"]]
    for rank, out in enumerate(values):
        check_bucket_contract(sizes, case["cap"], out["buckets"], what=f"rank {rank}: BucketedDDP.buckets over")


@given(ddp_cases())
def test_one_async_all_reduce_per_bucket_during_backward(target, record_property, case):
    values, trace = _run_ddp(target, case)
    sizes = [s for i, s in enumerate(grad_bytes(random_mlp(case["widths"], 0))) if i not in case["frozen"]]
    for rank in range(case["world_size"]):
        buckets = values[rank]["buckets"]
        for step in range(case["steps"]):
            backward = trace.phases(rank, "backward")[step]
            reduces = [op for op in trace.ops(rank, "all_reduce") if op.step == step]
            harness.check(len(reduces) == len(buckets),
                          f"messages per rank: the cost model says len(buckets) = {len(buckets)} all_reduce calls "
                          f"per backward (one per bucket), saw {len(reduces)}", rank=rank, step=step)
            for k, (op, bucket) in enumerate(zip(reduces, buckets)):
                label = f"all_reduce #{k + 1} ({op.site})"
                harness.check(op.phase == "backward",
                              f"{label} was issued in {op.phase!r}, after loss.backward() returned: it must be "
                              "launched from a gradient hook while backward still runs, to overlap with it",
                              rank=rank, step=step)
                harness.check(not op.blocking,
                              f"{label} was waited on inside the statement that issued it (synchronous): "
                              "use async_op=True and wait in finish_gradient_sync()", rank=rank, step=step)
                harness.check(op.wait_start is None or op.wait_start >= backward.end,
                              f"{label} was waited on before loss.backward() returned, stalling the backward pass",
                              rank=rank, step=step)
                want = sum(sizes[i] for i in bucket)
                harness.check(op.in_bytes == want,
                              f"{label} carried {op.in_bytes} bytes; bucket {k} {bucket} holds {want} bytes "
                              "(buckets must be reduced in bucket order, flattened into one tensor)",
                              rank=rank, step=step)
    # the figures of the last step on rank 0, from the trace: the checks above fixed them on every rank and step
    last = [op for op in trace.ops(0, "all_reduce") if op.step == case["steps"] - 1]
    cost.record(record_property, f"{len(values[0]['buckets'])} buckets of {sum(sizes)} gradient bytes "
                f"(cap {case['cap']}) on {case['world_size']} ranks", sum(sizes) * len(sizes),
                bytes_per_rank=(sum(sizes), sum(op.in_bytes for op in last)),
                messages_per_rank=(len(values[0]["buckets"]), len(last)))


@given(ddp_cases())
def test_frozen_parameters_never_communicated(target, record_property, case):
    _, trace = _run_ddp(target, case)
    trainable = sum(s for i, s in enumerate(grad_bytes(random_mlp(case["widths"], 0))) if i not in case["frozen"])
    sent = {}
    for rank in range(case["world_size"]):
        for step in range(case["steps"]):
            sent[rank, step] = sum(op.in_bytes for op in trace.ops(rank, step=step))
            harness.check(sent[rank, step] == trainable,
                          f"step communicated {sent[rank, step]} bytes, but bytes per rank in the cost model is "
                          f"Σ_trainable numel(p) · elem_size = {trainable}: the gradients that require grad, once "
                          f"(frozen parameters {sorted(case['frozen'])} must never be communicated)",
                          rank=rank, step=step)
    cost.record(record_property, f"{len(case['frozen'])} of {2 * (len(case['widths']) - 1)} parameters frozen, "
                f"{trainable} trainable gradient bytes on {case['world_size']} ranks", trainable,
                bytes_per_rank=(trainable, max(sent.values())))
