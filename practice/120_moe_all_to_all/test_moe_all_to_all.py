"""Problem 120 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); the expected values come from a
single-device MoE layer holding every expert, computed here in the test process, and
what was communicated comes from the harness's trace.  Each rank receives only its own
tokens, experts and output gradient, and the replicated router (``harness.per_rank``).
Parts 3 and 4 call ``moe_forward`` with ``capacity_factor=`` and ``return_stats=True``;
Parts 1 and 2 call it exactly as before, without them.
"""
import math

import torch
import torch.nn.functional as F
from hypothesis import assume, given, strategies as st

import harness
from testkit import cost, strategies as hs
from testkit.groups import member_group

F64 = dict(atol=1e-9, rtol=1e-7)
IDLE_LOGIT = -1e3        # an idle expert's router column makes its logit about this: never in the top-k
SPLIT_ERRORS = ("alltoall", "Split sizes", "size mismatch", "doesn't match expected size")
TIE_GAP = 1e-3           # routing is only compared where the k-th and (k+1)-th logits are at least this far apart
CAPACITY_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)   # dyadic: capacity_factor * T_r * top_k is exact
STATS_OPS = ("all_to_all", "all_reduce")   # what a call with return_stats=True may issue


@st.composite
def cases(draw, min_world=1, dtypes=(torch.float64,), empty_and_idle=False):
    """A layer: N ranks with E_local experts each, top_k, and how many tokens each rank holds (0 included)."""
    n = draw(hs.world_sizes(min_world))
    e_local = draw(st.integers(1, 3))
    idle = []
    if empty_and_idle:   # some experts nobody picks (sometimes all of one rank's), and a rank without tokens
        idle = sorted(draw(st.sets(st.integers(0, n * e_local - 1), max_size=n * e_local - 1)))
    top_k = draw(st.integers(1, min(2, n * e_local - len(idle))))
    tokens = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    if empty_and_idle:
        tokens[draw(st.integers(0, n - 1))] = 0
    return dict(world_size=n, e_local=e_local, top_k=top_k, tokens=tokens, dim=draw(st.integers(1, 4)),
                hidden=draw(st.integers(1, 4)), dtype=draw(st.sampled_from(dtypes)), idle=idle,
                seed=draw(hs.seeds()))


def layer(case, ranks=None):
    """Every rank's tokens, the router, all experts' weights and the output gradients, from the seed."""
    ranks = ranks or case["world_size"]
    gen = torch.Generator().manual_seed(case["seed"])
    d, h, experts = case["dim"], case["hidden"], ranks * case["e_local"]
    xs = [torch.randn(t, d, generator=gen, dtype=torch.float64) for t in case["tokens"][:ranks]]
    router_w = torch.randn(d, experts, generator=gen, dtype=torch.float64)
    w1 = torch.randn(experts, d, h, generator=gen, dtype=torch.float64) / d ** 0.5
    w2 = torch.randn(experts, h, d, generator=gen, dtype=torch.float64) / h ** 0.5
    dys = [torch.randn(t, d, generator=gen, dtype=torch.float64) for t in case["tokens"][:ranks]]
    if case["idle"]:          # a constant first feature carries the idle experts' large negative logit
        for x in xs:
            x[:, 0] = 1.0
        router_w[0, case["idle"]] = IDLE_LOGIT
    to = case["dtype"]
    return [x.to(to) for x in xs], router_w.to(to), w1.to(to), w2.to(to), [y.to(to) for y in dys]


def no_near_ties(xs, router_w, top_k, ordered=False):
    """True when every token's top-k set is clear: the k-th and (k+1)-th logits differ by TIE_GAP or more.
    ``ordered`` (capacity: first choices claim slots before second ones): every two of the top k + 1 too."""
    if top_k >= router_w.shape[1] and not ordered:
        return True
    logits = torch.cat(xs).double() @ router_w.double()
    top = logits.topk(min(top_k + 1, router_w.shape[1]), dim=-1).values
    if ordered:
        return bool((top[:, :-1] - top[:, 1:] >= TIE_GAP).all())
    return bool((top[:, top_k - 1] - top[:, top_k] >= TIE_GAP).all())


def single_device_moe(x, router_w, w1, w2, top_k, kept=None):
    """The truth: every token through its top-k experts, all experts on one device (vectorised by gather).
    ``kept`` ([T, top_k] bool): the pairs that got a slot; a dropped pair adds nothing to its token's output."""
    top, experts = (x @ router_w).topk(top_k, dim=-1)
    weights = torch.softmax(top, dim=-1)
    if kept is not None:
        weights = weights * kept
    hidden = F.gelu(torch.einsum("td,tkdh->tkh", x, w1[experts]))
    outputs = torch.einsum("tkh,tkhd->tkd", hidden, w2[experts])
    return (weights.unsqueeze(-1) * outputs).sum(1)


def capacity(tokens, top_k, n_experts, capacity_factor):
    """Slots per expert for one rank's tokens."""
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


def kept_pairs(x, router_w, top_k, capacity_factor):
    """[T_r, top_k] bool for one rank's tokens: which (token, choice) pairs get a slot.  Claims go choice rank by
    choice rank (all first choices, then all second ones), by token index within one; an expert takes the first
    ``capacity`` claims on it."""
    experts = (x.double() @ router_w.double()).topk(top_k, dim=-1).indices
    tokens, n_experts = x.shape[0], router_w.shape[1]
    kept = torch.zeros(tokens, top_k, dtype=torch.bool)
    if capacity_factor is None:
        return ~kept
    slots, taken = capacity(tokens, top_k, n_experts, capacity_factor), [0] * n_experts
    for j in range(top_k):
        for t in range(tokens):
            e = int(experts[t, j])
            if taken[e] < slots:
                taken[e], kept[t, j] = taken[e] + 1, True
    return kept


def aux_loss(x, router_w, top_k):
    """Switch's load-balancing loss over the whole batch: E * sum_e f_e * P_e, f_e the fraction of the (token,
    choice) pairs that chose e (dropping aside), P_e the mean of softmax(x @ router_w)[e]; 0 without tokens."""
    if x.shape[0] == 0:
        return (x @ router_w).sum()
    logits = x @ router_w
    n_experts = logits.shape[1]
    chosen = torch.bincount(logits.topk(top_k, dim=-1).indices.flatten(), minlength=n_experts).to(logits.dtype)
    f = chosen / (x.shape[0] * top_k)
    return n_experts * (f * torch.softmax(logits, dim=-1).mean(0)).sum()


def expected(xs, router_w, w1, w2, dys, top_k, capacity_factor=None, aux_coef=0.0):
    """Single-device output per rank, and the gradients of sum(y * dy) + aux_coef * aux_loss for x (per rank),
    router_w, w1, w2; with ``capacity_factor``, each rank's tokens dropped by the capacity of that rank."""
    kept = torch.cat([kept_pairs(t, router_w, top_k, capacity_factor) for t in xs])
    x, router_w, w1, w2 = (t.detach().double().requires_grad_() for t in (torch.cat(xs), router_w, w1, w2))
    y = single_device_moe(x, router_w, w1, w2, top_k, kept)
    loss = (y * torch.cat(dys).double()).sum()
    if aux_coef:
        loss = loss + aux_coef * aux_loss(x, router_w, top_k)
    loss.backward()
    sizes = [len(t) for t in xs]
    return list(y.detach().split(sizes)), list(x.grad.split(sizes)), router_w.grad, w1.grad, w2.grad


def expected_stats(xs, router_w, top_k, capacity_factor=None):
    """The aux loss (a float64 0-d tensor) and each rank's dropped (token, choice) pairs."""
    dropped = [int((~kept_pairs(t, router_w, top_k, capacity_factor)).sum()) for t in xs]
    return aux_loss(torch.cat(xs).double(), router_w.double(), top_k).detach(), dropped


def rank_inputs(case, tensors, backward=False, members=None):
    """What each rank receives: its own tokens, the replicated router, its own experts' weights and, for
    backward, its own output gradient; None outside the group.  No rank sees another rank's tokens or experts."""
    members = members or list(range(case["world_size"]))
    xs, router_w, w1, w2, dys = tensors
    e = case["e_local"]
    inputs = [None] * case["world_size"]
    for i, rank in enumerate(members):
        inputs[rank] = {"x": xs[i], "router_w": router_w, "w1": w1[i * e:(i + 1) * e].clone(),
                        "w2": w2[i * e:(i + 1) * e].clone(), "dy": dys[i] if backward else None}
    return harness.per_rank(inputs)


def _moe(target, mine, top_k, group_ranks=None, options=None, aux_coef=0.0):
    """Runs on every rank: the MoE layer on this rank's tokens and experts, then, given its ``dy``, backward
    (of sum(y * dy) + aux_coef * aux_loss with ``return_stats``).  ``options``: the keywords of Parts 3 and 4,
    passed only when given, so Parts 1 and 2 call moe_forward exactly as their contract says."""
    options = options or {}
    with member_group(group_ranks) as (group, members, i):
        if i is None:
            return None
        grad = mine["dy"] is not None
        x, router, w1, w2 = (mine[name].requires_grad_(grad) for name in ("x", "router_w", "w1", "w2"))
        with harness.phase("forward"):
            y = target.load().moe_forward(x, router, w1, w2, top_k, group=group, **options)
        if options.get("return_stats"):
            y, aux, dropped = harness.expect_type(y, "tuple[Tensor, Tensor, int]", "moe_forward(..., return_stats=True)")
        result = {"y": y.detach() if isinstance(y, torch.Tensor) else y}
        if options.get("return_stats"):
            result.update(aux=aux.detach(), dropped=dropped)
        if grad:
            loss = (y * mine["dy"]).sum()
            if options.get("return_stats"):
                loss = loss + aux_coef * aux
            with harness.phase("backward"):
                loss.backward()
            result["grads"] = {"x": x.grad, "router_w": router.grad, "w1": w1.grad, "w2": w2.grad}
        return result


def run(target, case, tensors, backward=False, members=None, aux_coef=0.0):
    options = {key: case[key] for key in ("capacity_factor", "return_stats") if case.get(key) is not None}
    try:
        return harness.run(_moe, case["world_size"], target, rank_inputs(case, tensors, backward, members),
                           case["top_k"], group_ranks=members, options=options, aux_coef=aux_coef,
                           allow=STATS_OPS if case.get("return_stats") else None)
    except harness.NotImplementedYet:
        raise
    except (harness.RankError, harness.RankCrashed) as e:
        hint = ""
        if any(s in str(e) for s in SPLIT_ERRORS):
            hint = ("; gloo refused an all_to_all whose split sizes disagree between ranks: what rank r sends to "
                    "rank s (its input_split_sizes[s]) must be what s expects from r (its output_split_sizes[r])")
        raise harness.PropertyFailed(f"{describe(case, members)}: the layer failed{hint}:\n{e}") from None


def describe(case, members=None):
    n = len(members) if members else case["world_size"]
    tokens = case["tokens"][:n]
    where = f"the group {members} of {case['world_size']} ranks" if members else f"{n} rank{'s' * (n > 1)}"
    idle = f", idle experts {case['idle']}" if case["idle"] else ""
    options = "".join(f", {key}={case[key]}" for key in ("capacity_factor", "return_stats") if case.get(key))
    return (f"moe_forward(top_k={case['top_k']}{options}) on {where} x {case['e_local']} experts, tokens per rank "
            f"{tokens}, d={case['dim']}, h={case['hidden']}, {case['dtype']}{idle}")


def check_outputs(values, case, want, members=None, truth=None):
    for i, rank in enumerate(members or range(case["world_size"])):
        y = values[rank]["y"]
        harness.check(isinstance(y, torch.Tensor), f"{describe(case, members)} returned {type(y).__name__}, "
                      "not a tensor", rank=rank)
        harness.assert_close(y, want[i].to(case["dtype"]), f"{describe(case, members)}: the output y of this "
                             f"rank's tokens ({truth[i] if truth else 'single-device MoE with every expert'})",
                             rank=rank, **F64)


def routing(xs, router_w, top_k, e_local):
    """sends[r][s]: how many (token, choice) pairs rank r sends to rank s (global expert e lives on e // E_local)."""
    n = len(xs)
    sends = []
    for x in xs:
        experts = (x.double() @ router_w.double()).topk(top_k, dim=-1).indices.flatten()
        sends.append(torch.bincount(experts // e_local, minlength=n).tolist())
    return sends


def rows_to_each_rank(op):
    """Bytes an all_to_all sends to each destination rank, from its input split sizes (rows of equal size)."""
    splits = list(op.splits[1]) if op.splits else []
    rows = sum(splits)
    return [op.in_bytes * part // rows if rows else 0 for part in splits]


# ---- Part 1: forward ---------------------------------------------------------------------------

@given(cases())
def test_output_matches_single_device(target, case):
    tensors = layer(case)
    assume(no_near_ties(tensors[0], tensors[1], case["top_k"]))
    values, _ = run(target, case, tensors)
    check_outputs(values, case, expected(*tensors, case["top_k"])[0])


@given(cases())
def test_three_all_to_all_per_forward(target, case):
    _, trace = run(target, case, layer(case))
    for rank in range(case["world_size"]):
        ops = trace.ops(rank, phase="forward")
        harness.check(len(ops) == 3 and all(op.kind == "all_to_all" for op in ops),
                      f"{describe(case)}: forward issued {len(ops)} ops ({'; '.join(op.describe() for op in ops)});"
                      " expected exactly 3 all_to_all: the token counts, the dispatch, the combine", rank=rank)


@given(cases(dtypes=(torch.float32, torch.float64)))
def test_dispatch_sends_each_token_choice_once(target, record_property, case):
    tensors = layer(case)
    xs, router_w = tensors[0], tensors[1]
    assume(no_near_ties(xs, router_w, case["top_k"]))
    _, trace = run(target, case, tensors)
    n, k, d, size = case["world_size"], case["top_k"], case["dim"], case["dtype"].itemsize
    sends = routing(xs, router_w, k, case["e_local"])
    measured, model = [], []      # per rank: (bytes per rank, busiest link, messages per rank)
    for rank in range(n):
        ops = trace.ops(rank, "all_to_all", phase="forward")
        harness.check(len(ops) == 3, f"{describe(case)}: forward issued {len(ops)} all_to_all, expected 3 "
                      "(counts, dispatch, combine, in that order)", rank=rank)
        dispatch, combine = ops[1], ops[2]
        tokens = case["tokens"][rank]
        harness.check(dispatch.in_bytes == tokens * k * d * size,
                      f"{describe(case)}: the dispatch (the 2nd all_to_all, {dispatch.site}) sent {dispatch.in_bytes} "
                      f"bytes; each of this rank's {tokens} tokens goes once to each of its {k} experts: "
                      f"T_r x top_k x d x element size = {tokens * k * d * size}", rank=rank)
        receives = [sends[src][rank] for src in range(n)]
        for op, name, want in ((dispatch, "dispatch", (receives, sends[rank])),
                               (combine, "combine", (sends[rank], receives))):
            harness.check(op.splits is not None and [list(s) for s in op.splits] == [list(w) for w in want],
                          f"{describe(case)}: the {name} all_to_all ({op.site}) used (output_split_sizes, "
                          f"input_split_sizes) = {op.splits}; routing sends {sends[rank]} token choices to ranks "
                          f"0..{n - 1} and receives {receives} from them (global expert e lives on rank "
                          f"e // E_local), so expected {want}", rank=rank)
        # the cost model: the combine sends back one d-wide row, in x's dtype, per row this rank's experts got
        arrived = sum(receives)
        harness.check(combine.in_bytes == arrived * d * size,
                      f"{describe(case)}: the combine (the 3rd all_to_all, {combine.site}) sent {combine.in_bytes} "
                      f"bytes; the cost model's bytes per rank is (T_r · top_k + A_r) · d · elem_size, of which the "
                      f"combine is A_r · d · elem_size = {arrived} rows x {d} x {size} = {arrived * d * size}: one "
                      f"expert output row per row received, in x's dtype", rank=rank)
        # the busiest link: a peer's dispatch rows out plus its combine rows back (the split sizes fix both)
        links = [a + b for a, b in zip(rows_to_each_rank(dispatch), rows_to_each_rank(combine))]
        measured.append((dispatch.in_bytes + combine.in_bytes, max((b for s, b in enumerate(links) if s != rank),
                                                                   default=0), len(ops)))
        model.append(((tokens * k + arrived) * d * size, max((sends[rank][s] + sends[s][rank] for s in range(n)
                                                              if s != rank), default=0) * d * size, 3))
    busiest = max(range(n), key=lambda r: model[r][0])    # the rank with most to move
    cost.record(record_property, describe(case), sum(case["tokens"]) * k * d * size,
                **{figure: (model[busiest][i], measured[busiest][i])
                   for i, figure in enumerate(("bytes_per_rank", "busiest_link", "messages_per_rank"))})


@given(cases(empty_and_idle=True))
def test_ranks_without_tokens_and_idle_experts(target, case):
    tensors = layer(case)
    assume(no_near_ties(tensors[0], tensors[1], case["top_k"]))
    try:
        values, trace = run(target, case, tensors)
    except harness.PropertyFailed as e:
        empty = [r for r, t in enumerate(case["tokens"]) if t == 0]
        idle = f" and experts {case['idle']} get none" if case["idle"] else ""
        raise harness.PropertyFailed(f"ranks {empty} hold no tokens{idle}, which must work: {e}") from None
    check_outputs(values, case, expected(*tensors, case["top_k"])[0])
    for rank in range(case["world_size"]):
        harness.check(len(trace.ops(rank, "all_to_all", phase="forward")) == 3,
                      f"{describe(case)}: a rank without tokens still takes part in all 3 all_to_all", rank=rank)


@hs.fewer_examples(0.3)
@given(st.data())
def test_runs_on_a_process_group(target, data):
    case = data.draw(cases(min_world=2))
    members = sorted(data.draw(st.sets(st.integers(0, case["world_size"] - 1), min_size=1)))
    assume(case["top_k"] <= len(members) * case["e_local"])
    tensors = layer(case, len(members))
    assume(no_near_ties(tensors[0], tensors[1], case["top_k"]))
    values, trace = run(target, case, tensors, members=members)
    check_outputs(values, case, expected(*tensors, case["top_k"])[0], members)
    for rank in range(case["world_size"]):
        harness.check(rank in members or not trace.ops(rank),
                      f"rank {rank} is outside the group {members} but communicated", rank=rank)


# ---- Part 2: backward --------------------------------------------------------------------------

def _grad(got, want, what, rank):
    """None stands for a gradient that is identically zero (e.g. the router's when top_k = 1)."""
    if got is None:
        harness.check(not bool(want.any()), f"{what} is None after backward, but it should be nonzero", rank=rank)
        return torch.zeros_like(want)
    return got


def check_gradients(values, case, want, members=None, loss="sum(y * dy)"):
    _, x_grads, router_grad, w1_grad, w2_grad = want
    e = case["e_local"]
    router_sum = torch.zeros_like(router_grad)
    for i, rank in enumerate(members or range(case["world_size"])):
        grads = values[rank]["grads"]
        what = f"{describe(case, members)}: the gradient of {loss} w.r.t."
        for name, full in (("x", x_grads[i]), ("w1", w1_grad[i * e:(i + 1) * e]), ("w2", w2_grad[i * e:(i + 1) * e])):
            got = _grad(grads[name], full, f"{what} {name}", rank)
            harness.assert_close(got, full, f"{what} {name} (this rank's slice of the single-device gradient)",
                                 rank=rank, **F64)
        if grads["router_w"] is not None or case["tokens"][i]:   # a rank without tokens contributes nothing
            router_sum += _grad(grads["router_w"], router_grad, f"{what} router_w", rank)
    harness.assert_close(router_sum, router_grad, f"{describe(case, members)}: the SUM over ranks of router_w.grad "
                         f"for {loss} (each rank's is its own tokens' contribution; moe_forward does not all-reduce "
                         "it)", **F64)


@hs.fewer_examples(0.5)
@given(cases())
def test_gradients_match_single_device(target, case):
    tensors = layer(case)
    assume(no_near_ties(tensors[0], tensors[1], case["top_k"]))
    values, _ = run(target, case, tensors, backward=True)
    check_gradients(values, case, expected(*tensors, case["top_k"]))


def splits_of(op):
    """(output_split_sizes, input_split_sizes) of an all_to_all; ((), ()) when it gave none (even splits)."""
    return tuple(tuple(s) for s in op.splits) if op.splits else ((), ())


def check_backward_mirrors(trace, case, rank):
    """Backward's ops on ``rank``: exactly the mirrors of the forward's dispatch and combine, nothing else."""
    forward = trace.ops(rank, "all_to_all", phase="forward")
    harness.check(len(forward) == 3, f"{describe(case)}: forward issued {len(forward)} all_to_all, expected 3 "
                  "(the counts, the dispatch, the combine, in that order)", rank=rank)
    tokens = forward[1:]      # the dispatch and the combine; the counts exchange needs no gradient
    mirrored = sorted((splits_of(op)[1], splits_of(op)[0], op.out_bytes) for op in tokens)
    backward = trace.ops(rank, phase="backward")
    got = sorted(splits_of(op) + (op.in_bytes,) for op in backward)
    harness.check(len(backward) == 2 and all(op.kind == "all_to_all" for op in backward) and got == mirrored,
                  f"{describe(case)}: backward issued {'; '.join(op.describe() for op in backward) or 'nothing'}"
                  f" with splits {[op.splits for op in backward]}; expected one all_to_all per token all_to_all "
                  f"of the forward (the dispatch and the combine), sending the gradients back the way the tokens "
                  f"came (split sizes swapped): splits {[(a, b) for a, b, _ in mirrored]}", rank=rank)


@hs.fewer_examples(0.5)
@given(cases())
def test_backward_mirrors_the_token_all_to_alls(target, case):
    _, trace = run(target, case, layer(case), backward=True)
    for rank in range(case["world_size"]):
        check_backward_mirrors(trace, case, rank)


# ---- Part 3: capacity and dropping -------------------------------------------------------------

@st.composite
def capacity_cases(draw, dtypes=(torch.float64,), factors=CAPACITY_FACTORS, stats=False, empty=False):
    """A layer with a capacity factor (None: no dropping) and, with ``stats``, return_stats=True; 0-8 tokens per
    rank, so that capacities above 1 are common.  ``empty``: at least one rank without tokens, and sometimes no
    rank with any."""
    case = draw(cases(dtypes=dtypes))
    case["tokens"] = draw(st.lists(st.integers(0, 8), min_size=case["world_size"], max_size=case["world_size"]))
    n_experts = case["world_size"] * case["e_local"]
    if factors == "large":       # capacity_factor >= E / top_k: every expert has a slot for every token
        case["capacity_factor"] = n_experts / case["top_k"] * draw(st.sampled_from([1, 2, 4]))
    else:
        case["capacity_factor"] = draw(st.sampled_from(factors))
    if empty:
        tokens = case["tokens"]
        tokens[draw(st.integers(0, len(tokens) - 1))] = 0
        if draw(st.booleans()):
            case["tokens"] = [0] * len(tokens)
    case["return_stats"] = stats or None
    return case


def drops(case, xs, router_w):
    """Per rank, in words: the capacity and which (token, choice) pairs the contract drops."""
    k, factor, n_experts = case["top_k"], case["capacity_factor"], router_w.shape[1]
    if factor is None:
        return ["no capacity, nothing dropped"] * len(xs)
    said = []
    for x in xs:
        gone = (~kept_pairs(x, router_w, k, factor)).nonzero().tolist()
        said.append(f"capacity ceil({factor} * {len(x)} * {k} / {n_experts}) = {capacity(len(x), k, n_experts, factor)} "
                    f"per expert; dropped (token, choice): {[tuple(p) for p in gone] or 'none'}")
    return said


def kept_routing(xs, router_w, top_k, e_local, capacity_factor):
    """sends[r][s]: how many kept (token, choice) pairs rank r sends to rank s."""
    sends = []
    for x in xs:
        experts = (x.double() @ router_w.double()).topk(top_k, dim=-1).indices
        kept = experts[kept_pairs(x, router_w, top_k, capacity_factor)]
        sends.append(torch.bincount(kept // e_local, minlength=len(xs)).tolist())
    return sends


@given(capacity_cases(factors=CAPACITY_FACTORS + (None,)))
def test_capacity_drops_the_overflow(target, case):
    tensors = layer(case)
    xs, router_w = tensors[0], tensors[1]
    assume(no_near_ties(xs, router_w, case["top_k"], ordered=True))
    values, _ = run(target, case, tensors)
    want = expected(*tensors, case["top_k"], case["capacity_factor"])[0]
    check_outputs(values, case, want, truth=[f"single-device MoE; {d}; a dropped pair adds 0 to its token's output"
                                             for d in drops(case, xs, router_w)])


@given(capacity_cases(factors=CAPACITY_FACTORS + (None,), stats=True))
def test_dropped_count_is_reported(target, case):
    tensors = layer(case)
    xs, router_w = tensors[0], tensors[1]
    assume(no_near_ties(xs, router_w, case["top_k"]))
    values, _ = run(target, case, tensors)
    _, dropped = expected_stats(xs, router_w, case["top_k"], case["capacity_factor"])
    for rank, (want, said) in enumerate(zip(dropped, drops(case, xs, router_w))):
        got = values[rank]["dropped"]
        harness.check(got == want, f"{describe(case)}: reported dropped = {got}; this rank's tokens drop {want} "
                      f"(token, choice) pairs ({said})", rank=rank)


@given(capacity_cases(factors="large", stats=True))
def test_large_capacity_is_the_old_layer(target, case):
    tensors = layer(case)
    xs, router_w = tensors[0], tensors[1]
    assume(no_near_ties(xs, router_w, case["top_k"]))
    values, trace = run(target, case, tensors)
    check_outputs(values, case, expected(*tensors, case["top_k"])[0],
                  truth=["single-device MoE, nothing dropped: an expert gets at most one pair per token, and "
                         "capacity >= T_r"] * case["world_size"])
    k, d, size = case["top_k"], case["dim"], case["dtype"].itemsize
    for rank in range(case["world_size"]):
        harness.check(values[rank]["dropped"] == 0, f"{describe(case)}: reported dropped = {values[rank]['dropped']}; "
                      f"capacity_factor >= E / top_k gives every expert T_r slots: nothing drops", rank=rank)
        ops = trace.ops(rank, "all_to_all", phase="forward")
        tokens = case["tokens"][rank]
        harness.check(len(ops) == 3 and ops[1].in_bytes == tokens * k * d * size,
                      f"{describe(case)}: forward issued {len(ops)} all_to_all, the 2nd (the dispatch) sending "
                      f"{ops[1].in_bytes if len(ops) > 1 else '-'} bytes; without drops it is the layer of Part 1: 3 "
                      f"all_to_all, the dispatch T_r x top_k x d x element size = {tokens * k * d * size}", rank=rank)


@hs.fewer_examples(0.5)
@given(capacity_cases(dtypes=(torch.float32, torch.float64)))
def test_dispatch_shrinks_to_the_capacity(target, case):
    tensors = layer(case)
    xs, router_w = tensors[0], tensors[1]
    assume(no_near_ties(xs, router_w, case["top_k"]))
    _, trace = run(target, case, tensors, backward=True)
    n, k, d, size, e = case["world_size"], case["top_k"], case["dim"], case["dtype"].itemsize, case["e_local"]
    sends = kept_routing(xs, router_w, k, e, case["capacity_factor"])
    for rank, said in enumerate(drops(case, xs, router_w)):
        ops = trace.ops(rank, phase="forward")
        harness.check(len(ops) == 3 and all(op.kind == "all_to_all" for op in ops),
                      f"{describe(case)}: forward issued {len(ops)} ops ({'; '.join(op.describe() for op in ops)}); "
                      "dropping needs no exchange of its own: exactly 3 all_to_all", rank=rank)
        dispatch, combine = ops[1], ops[2]
        kept = sum(sends[rank])
        slots = capacity(case["tokens"][rank], k, n * e, case["capacity_factor"])
        harness.check(dispatch.in_bytes == kept * d * size,
                      f"{describe(case)}: the dispatch ({dispatch.site}) sent {dispatch.in_bytes} bytes; only the "
                      f"{kept} kept pairs travel ({said}): {kept} x d x element size = {kept * d * size}, at most "
                      f"{slots} x E_local rows to each rank", rank=rank)
        receives = [sends[src][rank] for src in range(n)]
        for op, name, want in ((dispatch, "dispatch", (receives, sends[rank])),
                               (combine, "combine", (sends[rank], receives))):
            harness.check(op.splits is not None and [list(s) for s in op.splits] == [list(w) for w in want],
                          f"{describe(case)}: the {name} all_to_all ({op.site}) used (output_split_sizes, "
                          f"input_split_sizes) = {op.splits}; the kept pairs go {sends[rank]} to ranks 0..{n - 1} "
                          f"and {receives} come from them, so expected {want}", rank=rank)
        check_backward_mirrors(trace, case, rank)


@hs.fewer_examples(0.5)
@given(capacity_cases())
def test_gradients_with_dropping(target, case):
    tensors = layer(case)
    assume(no_near_ties(tensors[0], tensors[1], case["top_k"], ordered=True))
    values, _ = run(target, case, tensors, backward=True)
    check_gradients(values, case, expected(*tensors, case["top_k"], case["capacity_factor"]))


# ---- Part 4: the load-balancing loss -----------------------------------------------------------

AUX = ("aux_loss = E * sum_e f_e * P_e over every rank's tokens (f_e: the fraction of all (token, choice) pairs "
       "that chose e, dropped ones included; P_e: the mean of softmax(x @ router_w)[e] over all tokens)")


def check_aux(values, case, want, members=None):
    for rank in members or range(case["world_size"]):
        harness.assert_close(values[rank]["aux"], want.to(case["dtype"]), f"{describe(case, members)}: {AUX}, the "
                             "same on every rank", rank=rank, **F64)


@given(capacity_cases(factors=(None, 0.5, 1.0), stats=True))
def test_aux_loss_matches_single_device(target, case):
    tensors = layer(case)
    assume(no_near_ties(tensors[0], tensors[1], case["top_k"]))
    values, _ = run(target, case, tensors)
    check_aux(values, case, expected_stats(tensors[0], tensors[1], case["top_k"])[0])


@hs.fewer_examples(0.5)
@given(capacity_cases(factors=(None, 0.5, 1.0), stats=True))
def test_aux_loss_gradient(target, case):
    xs, router_w, w1, w2, dys = layer(case)
    assume(no_near_ties(xs, router_w, case["top_k"]))
    dys = [torch.zeros_like(dy) for dy in dys]      # the output's gradient is 0: what reaches router_w and x is aux's
    values, _ = run(target, case, (xs, router_w, w1, w2, dys), backward=True, aux_coef=1.0)
    check_gradients(values, case, expected(xs, router_w, w1, w2, dys, case["top_k"], case["capacity_factor"],
                                           aux_coef=1.0), loss="aux_loss")


@hs.fewer_examples(0.5)
@given(capacity_cases(factors=(None, 0.5, 1.0), stats=True))
def test_aux_loss_costs_one_small_all_reduce(target, case):
    _, trace = run(target, case, layer(case), backward=True, aux_coef=1.0)
    n_experts = case["world_size"] * case["e_local"]
    most = (2 * n_experts + 1) * 8
    for rank in range(case["world_size"]):
        ops = trace.ops(rank, phase="forward")
        extra = [op for op in ops if op.kind != "all_to_all"]
        harness.check(len(ops) - len(extra) == 3 and len(extra) <= 1
                      and all(op.kind == "all_reduce" and op.in_bytes <= most for op in extra),
                      f"{describe(case)}: forward issued {'; '.join(op.describe() for op in ops)}; expected the 3 "
                      f"all_to_all and at most one all_reduce of the routing statistics (at most 2E + 1 = "
                      f"{2 * n_experts + 1} numbers, {most} bytes)", rank=rank)
        check_backward_mirrors(trace, case, rank)


@hs.fewer_examples(0.5)
@given(capacity_cases(factors=CAPACITY_FACTORS + (None,), stats=True, empty=True))
def test_ranks_without_tokens_with_capacity_and_aux(target, case):
    tensors = layer(case)
    xs, router_w = tensors[0], tensors[1]
    assume(no_near_ties(xs, router_w, case["top_k"], ordered=True))
    empty = [r for r, t in enumerate(case["tokens"]) if t == 0]
    try:
        values, _ = run(target, case, tensors, backward=True, aux_coef=1.0)
    except harness.PropertyFailed as e:
        raise harness.PropertyFailed(f"ranks {empty} hold no tokens, which must work: {e}") from None
    aux, dropped = expected_stats(xs, router_w, case["top_k"], case["capacity_factor"])
    check_outputs(values, case, expected(*tensors, case["top_k"], case["capacity_factor"])[0],
                  truth=[f"single-device MoE; {d}" for d in drops(case, xs, router_w)])
    for rank in range(case["world_size"]):
        harness.check(values[rank]["dropped"] == dropped[rank], f"{describe(case)}: reported dropped = "
                      f"{values[rank]['dropped']}, expected {dropped[rank]}", rank=rank)
    where = "no rank holds a token: aux_loss is 0" if not any(case["tokens"]) else f"ranks {empty} hold no tokens"
    harness.check(all(bool(torch.isfinite(values[r]["aux"]).all()) for r in range(case["world_size"])),
                  f"{describe(case)}: aux_loss is {[values[r]['aux'] for r in range(case['world_size'])]} by rank; "
                  f"{where}")
    check_aux(values, case, aux)
    check_gradients(values, case, expected(*tensors, case["top_k"], case["capacity_factor"], aux_coef=1.0),
                    loss="sum(y * dy) + aux_loss")
