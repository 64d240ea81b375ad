"""Problem 126 properties.  Each test is one line of the statement's list.

The hooks run on real ranks, registered on torch's own DistributedDataParallel; expected
values come from single-process float64 gradients in the test process, and the bytes on the
wire from the harness's trace of the collectives issued during each backward pass.
"""
import math

import torch
import torch.distributed as dist
from hypothesis import example, given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.models import mse, random_batches, random_mlp, shard

U_BF16 = 2.0 ** -8      # unit roundoff of bfloat16 (8 significant bits)
ROWS = 8                # rows of each step's global batch: the gradients have full rank


@st.composite
def ddp_cases(draw, full_rank=False):
    """Two Linear layers [a, b, c] with a != b != c (so n < m and n > m), a bucket cap, r and the world."""
    a = draw(st.integers(1, 6))
    b = draw(st.integers(1, 6).filter(lambda v: v != a))
    c = draw(st.integers(1, 6).filter(lambda v: v != b))
    widths = [a, b, c]
    mins = [min(b, a), min(c, b)]
    r = draw(st.integers(max(mins), 7) if full_rank else st.integers(1, 6))
    return dict(world_size=draw(hs.world_sizes()), widths=widths, r=r, steps=draw(st.integers(1, 3)),
                cap_mb=draw(st.sampled_from([1e-6, 25.0])), seed=draw(hs.seeds()))


def unannotated(hook):
    """The hook behind a plain wrapper: DDP refuses hooks whose annotations it does not recognise."""
    def comm_hook(state, bucket):
        return hook(state, bucket)
    return comm_hook


def model_of(widths, seed, dtype, zero_weight=None):
    """The MLP of the case; with ``zero_weight``, that Linear layer's weight is all zeros."""
    model = random_mlp(widths, seed, dtype=dtype)
    if zero_weight is not None:
        with torch.no_grad():
            model[2 * zero_weight].weight.zero_()
    return model


def _train(target, hook, widths, dtype, r, steps, cap_mb, seed, loss_scale=1.0, zero_weight=None):
    """Runs on every rank: torch DDP with the hook; ``steps`` backward passes on new batches, no optimizer step.

    The loss is the MSE times ``loss_scale``.  Returns each step's gradients (the hook's averaged result, as DDP
    wrote it into .grad).
    """
    from torch.nn.parallel import DistributedDataParallel
    rank, world = dist.get_rank(), dist.get_world_size()
    module = target.load()
    model = model_of(widths, seed, dtype, zero_weight)
    with harness.phase("construct"):
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb)
        if hook == "bf16_compress_hook":
            state = module.BF16State(None)
        else:
            state = module.PowerSGDState(None, matrix_approximation_rank=r, seed=seed)
        ddp.register_comm_hook(state, unannotated(getattr(module, hook)))
    grads = []
    for step, (x, y) in enumerate(random_batches(steps, ROWS, widths[0], widths[-1], seed + 1, dtype=dtype)):
        model.zero_grad(set_to_none=True)
        loss = mse(ddp(shard(x, rank, world)), shard(y, rank, world)) * loss_scale
        with harness.phase("backward", step=step):
            loss.backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
    return grads


def _run(target, hook, case, dtype):
    args = {k: v for k, v in case.items() if k != "world_size"}
    return harness.run(_train, case["world_size"], target, hook, dtype=dtype, reuse=True, **args)


def local_grads(case, dtype):
    """Single-process, float64: grads[step][rank] = that rank's own gradients (before any averaging)."""
    model = model_of(case["widths"], case["seed"], dtype, case.get("zero_weight")).double()
    names = [n for n, _ in model.named_parameters()]
    world, out = case["world_size"], []
    for x, y in random_batches(case["steps"], ROWS, case["widths"][0], case["widths"][-1], case["seed"] + 1,
                               dtype=dtype):
        per_rank = []
        for rank in range(world):
            model.zero_grad()
            (mse(model(shard(x.double(), rank, world)), shard(y.double(), rank, world))
             * case.get("loss_scale", 1.0)).backward()
            per_rank.append([p.grad.clone() for p in model.parameters()])
        out.append(per_rank)
    return names, out


def _describe(case, what):
    scaled = f", the loss times {case['loss_scale']:g}" if case.get("loss_scale", 1.0) != 1.0 else ""
    zero = f", layer {case['zero_weight']}'s weight all zeros" if case.get("zero_weight") is not None else ""
    return (f"{what} on {case['world_size']} rank(s), Linear layers {case['widths']}{zero}, "
            f"bucket_cap_mb={case['cap_mb']}{scaled}")


def powersgd_with_r(case):
    return f"powersgd_hook with r={case['r']}"


def backward_bytes(trace, rank, step):
    return sum(op.in_bytes for op in trace.ops(rank, phase="backward", step=step))


# ---- bf16 -----------------------------------------------------------------------------------------

LARGEST_GRAD = 1e5      # past float16's largest value, 65504; bfloat16 reaches 3.4e38


@st.composite
def bf16_cases(draw):
    """ddp_cases, and half of the time the loss scaled by a power of two so that the largest gradient element
    is between 1e5 and 2e5 (float16 would overflow there, bfloat16 does not)."""
    case = draw(ddp_cases())
    if draw(st.booleans()):
        case["loss_scale"] = large_gradient_scale(case)
    return case


def large_gradient_scale(case):
    _, local = local_grads(case, torch.float32)
    largest = max(float(g.abs().max()) for per_rank in local for grads in per_rank for g in grads)
    return 2.0 ** math.ceil(math.log2(LARGEST_GRAD / largest))


BF16_EXAMPLES = [dict(world_size=3, widths=[5, 3, 4], r=1, steps=2, cap_mb=1e-6, seed=0),
                 dict(world_size=2, widths=[3, 4, 2], r=1, steps=1, cap_mb=25.0, seed=2, loss_scale=2.0 ** 18)]


def _bf16_examples(test):
    for ex in BF16_EXAMPLES:
        test = example(ex)(test)
    return test


@hs.fewer_examples(0.3)
@given(bf16_cases())
@_bf16_examples
def test_bf16_bytes_are_half_of_fp32(target, record_property, case):
    """bf16: each backward puts exactly 2 bytes per gradient element on the wire (half of float32), in
    bfloat16 tensors."""
    _, trace = _run(target, "bf16_compress_hook", case, torch.float32)
    numel = sum(p.numel() for p in random_mlp(case["widths"], 0).parameters())
    sent = {}
    for rank in range(case["world_size"]):
        for step in range(case["steps"]):
            for op in trace.ops(rank, phase="backward", step=step):
                harness.check(set(op.dtypes) == {"torch.bfloat16"},
                              f"{_describe(case, 'bf16_compress_hook')}: {op.describe()} carried {op.dtypes}; "
                              "the gradients go on the wire as torch.bfloat16 (float16 has the same size but "
                              "overflows past 65504)", rank=rank, step=step)
            sent[rank, step] = backward_bytes(trace, rank, step)
            harness.check(sent[rank, step] == 2 * numel,
                          f"{_describe(case, 'bf16_compress_hook')}: the backward pass's collectives carried "
                          f"{sent[rank, step]} bytes, but bytes per rank (bf16) in the cost model is 2 · numel = "
                          f"{2 * numel} for the {numel} gradient elements (float32 would be {4 * numel}): every "
                          "element goes on the wire once, as bf16", rank=rank, step=step)
    cost.record(record_property, _describe(case, "bf16_compress_hook"), numel * case["world_size"],
                **{"bytes per rank (bf16)": (2 * numel, max(sent.values()))})


@hs.fewer_examples(0.3)
@given(bf16_cases())
@_bf16_examples
def test_bf16_average_within_rounding_bound(target, case):
    """bf16: .grad is float32 and within ((1+u)^(N+1) - 1) * mean_i |g_i| of the exact average, u = 2^-8, also
    for gradients past float16's range."""
    values, _ = _run(target, "bf16_compress_hook", case, torch.float32)
    names, local = local_grads(case, torch.float32)
    n = case["world_size"]
    factor = (1 + U_BF16) ** (n + 1) - 1
    for rank, got_steps in enumerate(values):
        for step, got_params in enumerate(got_steps):
            for i, (name, got) in enumerate(zip(names, got_params)):
                gs = [local[step][j][i] for j in range(n)]
                exact = sum(gs) / n
                bound = factor * sum(g.abs() for g in gs) / n + 1e-6 * max(float(g.abs().max()) for g in gs)
                harness.check(got.dtype == torch.float32,
                              f"{name}.grad is {got.dtype}: the hook must copy the bf16 result back into the "
                              "float32 bucket", rank=rank, step=step)
                err = (got.double() - exact).abs()
                worst = int((err - bound).argmax())
                harness.check(bool((err <= bound).all()),
                              f"{_describe(case, 'bf16_compress_hook')}: {name}.grad element {worst} is "
                              f"{float(got.reshape(-1)[worst]):.6g}, the exact average over ranks is "
                              f"{float(exact.reshape(-1)[worst]):.6g}; |difference| "
                              f"{float(err.reshape(-1)[worst]):.3g} exceeds the bf16 rounding bound "
                              f"{float(bound.reshape(-1)[worst]):.3g}", rank=rank, step=step)


# ---- PowerSGD -------------------------------------------------------------------------------------

def compressed_elements(widths, r):
    """(n + m) * min(n, m, r) per n x m weight, plus every 1-D bias uncompressed."""
    total = 0
    for p in random_mlp(widths, 0).parameters():
        if p.dim() >= 2:
            n, m = p.shape[0], p.numel() // p.shape[0]
            total += (n + m) * min(n, m, r)
        else:
            total += p.numel()
    return total


def against_exact_average(case, values):
    """(rank, step, name, got, the exact float64 average over ranks) for every gradient the ranks returned."""
    names, local = local_grads(case, torch.float64)
    n = case["world_size"]
    for rank, got_steps in enumerate(values):
        for step, got_params in enumerate(got_steps):
            for i, (name, got) in enumerate(zip(names, got_params)):
                yield rank, step, name, got, sum(local[step][j][i] for j in range(n)) / n


PSGD_EXAMPLES = [dict(world_size=3, widths=[5, 3, 6], r=1, steps=3, cap_mb=1e-6, seed=0),
                 dict(world_size=2, widths=[2, 6, 4], r=2, steps=2, cap_mb=25.0, seed=1)]


def _with_examples(test):
    for ex in PSGD_EXAMPLES:
        test = example(ex)(test)
    return test


@hs.fewer_examples(0.3)
@given(ddp_cases())
@_with_examples
def test_powersgd_bytes_are_the_low_rank_size(target, record_property, case):
    """PowerSGD: each backward sends (n + m) * min(n, m, r) elements per n x m weight, plus the biases uncompressed."""
    _, trace = _run(target, "powersgd_hook", case, torch.float64)
    want = 8 * compressed_elements(case["widths"], case["r"])
    full = 8 * sum(p.numel() for p in random_mlp(case["widths"], 0).parameters())
    sent = {}
    for rank in range(case["world_size"]):
        for step in range(case["steps"]):
            sent[rank, step] = backward_bytes(trace, rank, step)
            harness.check(sent[rank, step] == want,
                          f"{_describe(case, powersgd_with_r(case))}: the backward pass's collectives carried "
                          f"{sent[rank, step]} bytes, but bytes per rank (PowerSGD) in the cost model is "
                          "(Σ_W (n + m) · min(n, m, r) + Σ_b numel(b)) · elem_size: P and Q per weight plus the 1-D "
                          f"biases, {want} bytes in float64 (uncompressed: {full})", rank=rank, step=step)
    cost.record(record_property, _describe(case, powersgd_with_r(case)), full * case["world_size"],
                **{"bytes per rank (PowerSGD)": (want, max(sent.values()))})


@hs.fewer_examples(0.3)
@given(ddp_cases())
@_with_examples
def test_powersgd_vectors_are_averaged_exactly(target, case):
    """PowerSGD: 1-D gradients (biases) are the exact average over ranks."""
    values, _ = _run(target, "powersgd_hook", case, torch.float64)
    for rank, step, name, got, want in against_exact_average(case, values):
        if got.dim() == 1:
            harness.assert_close(got, want, f"{_describe(case, 'powersgd_hook')}: {name}.grad, a 1-D tensor, "
                                 "against the exact average over ranks (1-D tensors are not compressed)",
                                 rank=rank, step=step, atol=1e-12, rtol=1e-9)


@hs.fewer_examples(0.3)
@given(ddp_cases(full_rank=True))
@example(dict(world_size=3, widths=[5, 3, 6], r=3, steps=3, cap_mb=1e-6, seed=0))
def test_powersgd_full_rank_is_exact(target, case):
    """PowerSGD with r >= min(n, m): every gradient is the exact average over ranks, at every step."""
    values, _ = _run(target, "powersgd_hook", case, torch.float64)
    for rank, step, name, got, want in against_exact_average(case, values):
        harness.assert_close(got, want, f"{_describe(case, powersgd_with_r(case))}: "
                             f"{name}.grad against the exact average over ranks (with r >= min(n, m), "
                             "P Q^T reproduces the matrix)", rank=rank, step=step, atol=1e-10, rtol=1e-7)


def compressed_weights(case, values):
    """For each weight and step: (name, step, M, the results per rank), M = average over ranks of (g + e).

    e is the error left by the earlier steps, which the test rebuilds from the results it saw (rank 0's):
    average(e_t) = sum over s < t of (average(g_s) - R_s).
    """
    names, local = local_grads(case, torch.float64)
    n = case["world_size"]
    for i, name in enumerate(names):
        if local[0][0][i].dim() < 2:
            continue
        err = torch.zeros_like(local[0][0][i])
        for step in range(case["steps"]):
            M = sum(local[step][j][i] for j in range(n)) / n + err
            results = [values[rank][step][i] for rank in range(n)]
            yield name, step, M, results
            err = M - results[0]


def kept_rank(M, r):
    """r' = min(n, m, r) for an n x m matrix."""
    return min(M.shape[0], M.shape[1], r)


@hs.fewer_examples(0.3)
@given(ddp_cases())
@_with_examples
def test_powersgd_is_a_rank_r_projection_with_error_feedback(target, case):
    """PowerSGD: each weight's result R is the projection of M = average(g + e) onto an r'-dimensional column space.

    r' = min(n, m, r); e is the error left by the earlier steps (``compressed_weights``).  The checks: every
    rank holds the same R, R has r' non-negligible singular values, and R^T (M - R) = 0.
    """
    values, _ = _run(target, "powersgd_hook", case, torch.float64)
    for name, step, M, results in compressed_weights(case, values):
        R0 = results[0]
        for rank, got in enumerate(results[1:], start=1):
            harness.assert_close(got, R0, f"{name}.grad on rank {rank} against rank 0's: the replicas must get "
                                 "the same averaged gradient", rank=rank, step=step, atol=1e-12, rtol=1e-9)
        rows, cols = M.shape
        r = kept_rank(M, case["r"])
        scale = float(torch.linalg.matrix_norm(M, 2))
        sv = torch.linalg.svdvals(R0)
        what = f"{_describe(case, powersgd_with_r(case))}: {name}.grad ({rows} x {cols})"
        harness.check(float(sv[r - 1]) > 1e-6 * scale and (len(sv) == r or float(sv[r]) <= 1e-8 * scale),
                      f"{what} has singular values {[round(float(s), 8) for s in sv]}, but a rank-{r} "
                      f"approximation P Q^T of a matrix with largest singular value {scale:.4g} has exactly "
                      f"{r} that are not ~0", step=step)
        resid = float(torch.linalg.matrix_norm(R0.T @ (M - R0), 2))
        harness.check(resid <= 1e-8 * scale ** 2,
                      f"{what} is not the orthogonal projection of M = average over ranks of (gradient + error "
                      f"feedback) onto its column space: |R^T (M - R)| = {resid:.3g} (|M|^2 = {scale ** 2:.3g}). "
                      "P must be orthonormalised after its all-reduce, Q = M^T P averaged over ranks, and each "
                      "rank's error buffer must be (its g + e) - R", step=step)


@hs.fewer_examples(0.3)
@given(ddp_cases())
@_with_examples
def test_powersgd_q_is_warm_started(target, case):
    """PowerSGD: from the second step on, Q is the previous step's averaged Q (warm start).

    With R = P Q^T and P orthonormal, the previous Q is R_prev^T P_prev, so span(M Q) = span(M R_prev^T): the
    result must be the projection of M onto that span, whichever orthonormal P each step chose.
    """
    values, _ = _run(target, "powersgd_hook", case, torch.float64)
    previous = {}
    for name, step, M, results in compressed_weights(case, values):
        R, R_prev = results[0], previous.get(name)
        previous[name] = R
        r = kept_rank(M, case["r"])
        if R_prev is None or r == min(M.shape):
            continue                    # the first step's Q is free; at full rank every Q gives M
        U, sv, _ = torch.linalg.svd(M @ R_prev.T)
        if float(sv[r - 1]) <= 1e-6 * float(sv[0]):
            continue                    # M Q is nearly rank-deficient: its span is not well defined
        basis = U[:, :r]
        want = basis @ (basis.T @ M)
        scale = float(torch.linalg.matrix_norm(M, 2))
        harness.assert_close(R, want, f"{_describe(case, powersgd_with_r(case))}: {name}.grad ({M.shape[0]} x "
                             f"{M.shape[1]}, r' = {r}) against the projection of M = average(g + e) onto "
                             "span(M Q) with Q the previous step's averaged Q: from the second step on, P = M Q "
                             "starts from the last Q (warm start), not from a new random one", step=step,
                             atol=1e-8 * scale, rtol=0)


@st.composite
def zero_weight_cases(draw):
    """ddp_cases with one Linear layer's weight all zeros: zero weight 1 makes layer 0's gradient zero, zero
    weight 0 makes layer 1's gradient rank 1 (every row of its input is the same)."""
    return dict(draw(ddp_cases()), zero_weight=draw(st.integers(0, 1)))


@hs.fewer_examples(0.3)
@given(zero_weight_cases())
@example(dict(world_size=2, widths=[3, 4, 5], r=2, steps=2, cap_mb=1e-6, seed=0, zero_weight=1))
@example(dict(world_size=3, widths=[4, 3, 5], r=2, steps=2, cap_mb=25.0, seed=1, zero_weight=0))
def test_powersgd_zero_and_rank_deficient_gradients(target, case):
    """PowerSGD on a model with a zero weight: every .grad stays finite, and a weight whose M = average(g + e)
    is zero or has rank at most r' gets exactly M."""
    values, _ = _run(target, "powersgd_hook", case, torch.float64)
    what = _describe(case, powersgd_with_r(case))
    names = [n for n, _ in random_mlp(case["widths"], 0).named_parameters()]
    for rank, got_steps in enumerate(values):
        for step, got_params in enumerate(got_steps):
            for name, got in zip(names, got_params):
                bad = int((~torch.isfinite(got)).sum())
                harness.check(bad == 0, f"{what}: {name}.grad holds {bad} inf/NaN values of {got.numel()}: a zero "
                              "or rank-deficient gradient makes P = M Q zero or rank-deficient, and "
                              "orthonormalising it must not divide by a zero norm", rank=rank, step=step)
    for name, step, M, results in compressed_weights(case, values):
        r = kept_rank(M, case["r"])
        sv = torch.linalg.svdvals(M)
        if float(sv[0]) > 0 and len(sv) > r and float(sv[r]) > 1e-10 * float(sv[0]):
            continue                    # rank above r': compressed, checked by the projection property
        for rank, got in enumerate(results):
            harness.assert_close(got, M, f"{what}: {name}.grad ({M.shape[0]} x {M.shape[1]}) against M = average "
                                 f"over ranks of (gradient + error feedback), whose rank is at most r' = {r}: the "
                                 "projection onto span(P) must give M itself", rank=rank, step=step,
                                 atol=1e-9 * float(sv[0]) + 1e-12, rtol=0)


# ---- error feedback -------------------------------------------------------------------------------

EF_STEPS = 48
EF_BOUND = 12.0


@st.composite
def feedback_cases(draw):
    n = draw(st.integers(2, 6))
    m = draw(st.integers(2, 6).filter(lambda v: v != n))
    return dict(world_size=draw(hs.world_sizes()), n=n, m=m, r=draw(st.integers(1, min(n, m) - 1)),
                cap_mb=draw(st.sampled_from([1e-6, 25.0])), seed=draw(hs.seeds()))


def constant_gradient_batches(case):
    """Per rank (x_i, c_i) with loss sum(c_i * Linear(x_i)): the weight's gradient c_i^T x_i never changes.

    Their average is U V^T with r + 1 orthonormal column pairs: every singular value is 1, so a rank-r
    approximation drops at least 1 of them at every step.  Each rank adds a term that cancels over ranks.
    """
    gen = torch.Generator().manual_seed(case["seed"])
    n, m, s, world = case["n"], case["m"], case["r"] + 1, case["world_size"]
    U = torch.linalg.qr(torch.randn(n, s, generator=gen, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(m, s, generator=gen, dtype=torch.float64)).Q
    a = torch.randn(world, n, generator=gen, dtype=torch.float64)
    a -= a.mean(0)
    b = torch.randn(1, m, generator=gen, dtype=torch.float64)
    return [(torch.cat([V.T, b]), torch.cat([U.T, 0.5 * a[i:i + 1]])) for i in range(world)]


def _constant_gradient(target, n, m, r, cap_mb, seed, steps, batch):
    """Runs on every rank: a Linear(m, n) whose weight gets the same gradient at every step."""
    from torch.nn.parallel import DistributedDataParallel
    module = target.load()
    model = random_mlp([m, n], seed)
    ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    ddp.register_comm_hook(module.PowerSGDState(None, matrix_approximation_rank=r, seed=seed),
                           unannotated(module.powersgd_hook))
    x, c = batch
    weights = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        (ddp(x) * c).sum().backward()
        weights.append(model[0].weight.grad.detach().clone())
    return weights


@hs.fewer_examples(0.2)
@given(feedback_cases())
@example(dict(world_size=3, n=5, m=2, r=1, cap_mb=1e-6, seed=0))
def test_error_feedback_keeps_the_sum_of_updates_close(target, case):
    """PowerSGD: with a constant gradient g, |sum of k applied updates - k g| <= 12 |g| for every k <= 48."""
    batches = constant_gradient_batches(case)
    values, _ = harness.run(_constant_gradient, case["world_size"], target, case["n"], case["m"], case["r"],
                            case["cap_mb"], case["seed"], EF_STEPS, harness.per_rank(batches), timeout=60)
    g = sum(c.T @ x for x, c in batches) / case["world_size"]
    limit = EF_BOUND * float(torch.linalg.matrix_norm(g))
    for rank, updates in enumerate(values):
        total = torch.zeros_like(g)
        for k, update in enumerate(updates, start=1):
            total += update
            drift = float(torch.linalg.matrix_norm(total - k * g))
            harness.check(drift <= limit,
                          f"powersgd_hook with r={case['r']} on a {case['n']} x {case['m']} weight whose gradient "
                          f"g (singular values all 1, rank {case['r'] + 1}) is the same at every step, "
                          f"{case['world_size']} rank(s): after {k} steps the sum of the applied gradients is "
                          f"{drift:.3g} away from {k} g (|g| = {limit / EF_BOUND:.3g}; bound {EF_BOUND:g} |g|). "
                          "Without error feedback the dropped part adds up step after step", rank=rank)
