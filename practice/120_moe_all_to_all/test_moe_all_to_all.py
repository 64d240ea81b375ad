"""Problem 120 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``); the expected values come from a
single-device MoE layer holding every expert, computed here in the test process, and
what was communicated comes from the harness's trace.  Each rank receives only its own
tokens, experts and output gradient, and the replicated router (``harness.per_rank``).
"""
import torch
import torch.nn.functional as F
from hypothesis import assume, given, strategies as st

import harness
from testkit import strategies as hs
from testkit.groups import member_group

F64 = dict(atol=1e-9, rtol=1e-7)
IDLE_LOGIT = -1e3        # an idle expert's router column makes its logit about this: never in the top-k
SPLIT_ERRORS = ("alltoall", "Split sizes", "size mismatch", "doesn't match expected size")
TIE_GAP = 1e-3           # routing is only compared where the k-th and (k+1)-th logits are at least this far apart


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


def no_near_ties(xs, router_w, top_k):
    """True when every token's top-k set is clear: the k-th and (k+1)-th logits differ by TIE_GAP or more."""
    if top_k >= router_w.shape[1]:
        return True
    logits = torch.cat(xs).double() @ router_w.double()
    top = logits.topk(top_k + 1, dim=-1).values
    return bool((top[:, top_k - 1] - top[:, top_k] >= TIE_GAP).all())


def single_device_moe(x, router_w, w1, w2, top_k):
    """The truth: every token through its top-k experts, all experts on one device (vectorised by gather)."""
    top, experts = (x @ router_w).topk(top_k, dim=-1)
    weights = torch.softmax(top, dim=-1)
    hidden = F.gelu(torch.einsum("td,tkdh->tkh", x, w1[experts]))
    outputs = torch.einsum("tkh,tkhd->tkd", hidden, w2[experts])
    return (weights.unsqueeze(-1) * outputs).sum(1)


def expected(xs, router_w, w1, w2, dys, top_k):
    """Single-device output per rank, and the gradients of sum(y * dy) for x (per rank), router_w, w1, w2."""
    x, router_w, w1, w2 = (t.detach().double().requires_grad_() for t in (torch.cat(xs), router_w, w1, w2))
    y = single_device_moe(x, router_w, w1, w2, top_k)
    (y * torch.cat(dys).double()).sum().backward()
    sizes = [len(t) for t in xs]
    return list(y.detach().split(sizes)), list(x.grad.split(sizes)), router_w.grad, w1.grad, w2.grad


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


def _moe(target, mine, top_k, group_ranks=None):
    """Runs on every rank: the MoE layer on this rank's tokens and experts, then, given its ``dy``, backward."""
    with member_group(group_ranks) as (group, members, i):
        if i is None:
            return None
        grad = mine["dy"] is not None
        x, router, w1, w2 = (mine[name].requires_grad_(grad) for name in ("x", "router_w", "w1", "w2"))
        with harness.phase("forward"):
            y = target.load().moe_forward(x, router, w1, w2, top_k, group=group)
        result = {"y": y.detach() if isinstance(y, torch.Tensor) else y}
        if grad:
            with harness.phase("backward"):
                (y * mine["dy"]).sum().backward()
            result["grads"] = {"x": x.grad, "router_w": router.grad, "w1": w1.grad, "w2": w2.grad}
        return result


def run(target, case, tensors, backward=False, members=None):
    try:
        return harness.run(_moe, case["world_size"], target, rank_inputs(case, tensors, backward, members),
                           case["top_k"], group_ranks=members)
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
    return (f"moe_forward(top_k={case['top_k']}) on {where} x {case['e_local']} experts, tokens per rank {tokens}, "
            f"d={case['dim']}, h={case['hidden']}, {case['dtype']}{idle}")


def check_outputs(values, case, want, members=None):
    for i, rank in enumerate(members or range(case["world_size"])):
        y = values[rank]["y"]
        harness.check(isinstance(y, torch.Tensor), f"{describe(case, members)} returned {type(y).__name__}, "
                      "not a tensor", rank=rank)
        harness.assert_close(y, want[i].to(case["dtype"]), f"{describe(case, members)}: the output y of this "
                             "rank's tokens (single-device MoE with every expert)", rank=rank, **F64)


def routing(xs, router_w, top_k, e_local):
    """sends[r][s]: how many (token, choice) pairs rank r sends to rank s (global expert e lives on e // E_local)."""
    n = len(xs)
    sends = []
    for x in xs:
        experts = (x.double() @ router_w.double()).topk(top_k, dim=-1).indices.flatten()
        sends.append(torch.bincount(experts // e_local, minlength=n).tolist())
    return sends


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
def test_dispatch_sends_each_token_choice_once(target, case):
    tensors = layer(case)
    xs, router_w = tensors[0], tensors[1]
    assume(no_near_ties(xs, router_w, case["top_k"]))
    _, trace = run(target, case, tensors)
    n, k, d, size = case["world_size"], case["top_k"], case["dim"], case["dtype"].itemsize
    sends = routing(xs, router_w, k, case["e_local"])
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


def check_gradients(values, case, want, members=None):
    _, x_grads, router_grad, w1_grad, w2_grad = want
    e = case["e_local"]
    router_sum = torch.zeros_like(router_grad)
    for i, rank in enumerate(members or range(case["world_size"])):
        grads = values[rank]["grads"]
        what = f"{describe(case, members)}: the gradient of"
        for name, full in (("x", x_grads[i]), ("w1", w1_grad[i * e:(i + 1) * e]), ("w2", w2_grad[i * e:(i + 1) * e])):
            got = _grad(grads[name], full, f"{what} {name}", rank)
            harness.assert_close(got, full, f"{what} {name} (this rank's slice of the single-device gradient)",
                                 rank=rank, **F64)
        router_sum += _grad(grads["router_w"], router_grad, f"{what} router_w", rank)
    harness.assert_close(router_sum, router_grad, f"{describe(case, members)}: the SUM over ranks of router_w.grad "
                         "(each rank's is its own tokens' contribution; moe_forward does not all-reduce it)", **F64)


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


@hs.fewer_examples(0.5)
@given(cases())
def test_backward_mirrors_the_token_all_to_alls(target, case):
    _, trace = run(target, case, layer(case), backward=True)
    for rank in range(case["world_size"]):
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
