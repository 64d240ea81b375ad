"""Problem 125 properties.  Each test is one line of the statement's list.

Learner code runs only on the ranks (``harness.run``), which share one folder per test module
(``harness.SharedFolder``); every hypothesis example gets its own sub-folder, made here.  Expected values come
from uninterrupted single-process training in this process (``ckpt_data.oracle``).  Which samples a
rank consumed is read from the dataset's own log of ``dataset[i]`` calls, never from the trainer.
Each rank is given the model and only its own samples (``harness.per_rank``); the seeds of the model
and the data stay here.
"""
import copy
import hashlib
import os
import re
import shutil
import time

import pytest
import torch
import torch.distributed as dist
from hypothesis import Phase, example, given, reject, settings, strategies as st

import harness
from ckpt_data import LoggedDataset, epoch_batches, make_data, oracle
from testkit import cost, strategies as hs
from testkit.flat_shards import owned_real, shard_size
from testkit.models import OptimizerSpec, random_mlp

ATOL, RTOL = 1e-9, 1e-7


@pytest.fixture(scope="module")
def shared():
    """The folder every rank of this module's calls may write in (``harness.SharedFolder``: a probe)."""
    return harness.SharedFolder()


def _folder(shared, *key):
    """A sub-folder for one case, named by the case, made here (the ranks may write only under ``shared``)."""
    name = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    path = os.path.join(shared.path, name)
    os.makedirs(path, exist_ok=True)
    return path


@st.composite
def resume_cases(draw):
    n_save = draw(hs.world_sizes())
    stateful = hs.optimizers().filter(lambda o: o.name != "SGD" or "momentum" in o.kwargs)
    return dict(n_save=n_save, n_resume=draw(hs.world_sizes().filter(lambda m: m != n_save)),
                widths=draw(st.lists(st.integers(1, 4), min_size=2, max_size=3)),
                n=draw(st.integers(1, 11)), global_batch=draw(st.integers(1, 5)),
                k1=draw(st.one_of(st.integers(1, 4), st.integers(9, 11))), k2=draw(st.integers(1, 3)),
                optimizer=draw(stateful), dropout=draw(st.sampled_from([0.25, 0.5])),
                seed=draw(hs.seeds()), init_seed=draw(hs.seeds()), data_seed=draw(hs.seeds()))


# Resumes mid-epoch (step 10 of 3-step epochs) after a partial batch, past step 9, from 3 ranks onto 2, with Adam.
# Pinned, since the three properties of one run share it (reuse), so it costs one run per session.
_RESUME_EXAMPLE = dict(n_save=3, n_resume=2, widths=[3, 4, 2], n=7, global_batch=3, k1=10, k2=2,
                       optimizer=OptimizerSpec("Adam", {"lr": 0.05}), dropout=0.5, seed=5, init_seed=1, data_seed=2)


def _describe(case, resumed_on=None):
    n, m = case["n_save"], case["n_resume"] if resumed_on is None else resumed_on
    return (f"{case['optimizer']}, dataset of {case['n']} samples, global batch {case['global_batch']}, "
            f"dropout {case['dropout']}, saved on {n} rank(s), resumed on {m}")


# ---- what runs on the ranks ---------------------------------------------------------------------

def _optimizer_view(opt):
    """This rank's local optimizer: its parameter elements, and each state concatenated over its parameters."""
    params = [p for g in getattr(opt, "param_groups", []) for p in g["params"]]
    flat, scalars = {}, {}
    for p in params:
        for k, v in opt.state.get(p, {}).items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                flat.setdefault(k, []).append(v.detach().reshape(-1).cpu().clone())
            elif isinstance(v, (torch.Tensor, int, float)):
                scalars[k] = float(v)
    flat_params = torch.cat([p.detach().reshape(-1).cpu() for p in params]) if params else torch.zeros(0, device="cpu")
    return {"is_optimizer": isinstance(opt, torch.optim.Optimizer), "params": flat_params,
            "state": {k: torch.cat(v) for k, v in flat.items()}, "scalars": scalars}


def _trainer(m, setup, given):
    """A Trainer on this rank's model and its own samples (the dataset returns CPU tensors, as the contract says)."""
    opt = setup["optimizer"]
    dataset = LoggedDataset(given["x"].cpu(), given["y"].cpu())
    return m.Trainer(given["model"], dataset, setup["global_batch"], opt.cls, setup["seed"], setup["dropout"],
                     **opt.kwargs), dataset


def _session(target, setup, given, directory, steps, resume, save, check=False, catch=False):
    """Build a Trainer, optionally resume, train ``steps`` steps (saving after each if asked).

    After each save, whether its COMMIT existed when save() returned on this rank.  ``catch``: an exception out
    of resume() is returned ({"resume_error": ...}) rather than raised."""
    m = target.load()
    model = given["model"]
    with harness.phase("construct"):
        trainer, dataset = _trainer(m, setup, given)
    out = {"start": 0, "committed": []}
    if resume:
        with harness.phase("resume"):
            try:
                out["start"] = trainer.resume(directory)
            except NotImplementedError:
                raise
            except Exception as e:  # noqa: BLE001 -- reported back to the test process
                if not catch:
                    raise
                return {"resume_error": f"{type(e).__name__}({str(e)!r})"}
        out["resumed_params"] = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
        if check:
            out["resumed_optimizer"] = _optimizer_view(trainer.local_optimizer)
    out["fetched"], out["history"] = [], []
    for step in range(steps):
        before = len(dataset.fetched)
        with harness.phase("train", step=step):
            trainer.train_step()
        out["fetched"].append(list(dataset.fetched[before:]))
        out["history"].append(torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]))
        if save:
            k = trainer.step
            with harness.phase("save", step=step):
                trainer.save(directory, k)
            out["committed"].append(os.path.isfile(os.path.join(directory, f"step_{k}", "COMMIT")))
    if check:
        out["optimizer"] = _optimizer_view(trainer.local_optimizer)
    return out


def trainer_setup(case):
    """What every rank builds its Trainer with, besides the model and the data: the contract's arguments."""
    return {key: case[key] for key in ("global_batch", "optimizer", "seed", "dropout")}


def given_to_ranks(case, world, first_step, steps, resumed):
    """per_rank: the model, and a dataset of all n rows holding real values only for the samples that rank
    fetches in steps [first_step, first_step + steps) (the others are NaN).  A resumed run gets a fresh model
    (other weights): only what resume() loads can make it right."""
    model = random_mlp(case["widths"], case["init_seed"] + (1 if resumed else 0))
    x, y = make_data(case["n"], case["widths"][0], case["widths"][-1], case["data_seed"])
    given = []
    for rank in range(world):
        mine = sorted({i for step in range(first_step, first_step + steps)
                       for i in epoch_batches(case["n"], case["global_batch"], case["seed"], step)[1][rank::world]})
        own_x, own_y = torch.full_like(x, float("nan")), torch.full_like(y, float("nan"))
        own_x[mine], own_y[mine] = x[mine], y[mine]
        given.append({"model": model, "x": own_x, "y": own_y})
    return harness.per_rank(given)


def _paths_under(folder):
    for dirpath, _, files in os.walk(folder):
        yield dirpath
        yield from (os.path.join(dirpath, f) for f in files)


def _copy_newest_out_of_order(folder, newest):
    """Make step_<newest> and everything in it 60 s older than every other checkpoint, as a copy made out of
    order leaves them: file times say nothing about which step is the newest."""
    others = [os.path.join(folder, e) for e in os.listdir(folder) if e.startswith("step_") and e != f"step_{newest}"]
    if not others:
        return
    when = min(os.path.getmtime(p) for other in others for p in _paths_under(other)) - 60
    for path in _paths_under(os.path.join(folder, f"step_{newest}")):
        os.utime(path, (when, when))


def _save_then_resume(target, case, shared):
    """Call A: train k1 steps on N ranks, saving after each.  Then step_<k1> is made to look older than the
    other checkpoints.  Call C: resume on M ranks, train k2 more."""
    folder = _folder(shared, "resume", target.digest(), case)   # one per file judged: several share a process
    k1, k2, setup = case["k1"], case["k2"], trainer_setup(case)
    saving = harness.run(_session, case["n_save"], target, setup, given_to_ranks(case, case["n_save"], 0, k1, False),
                         folder, k1, False, True, probes=[shared], reuse=True)
    _copy_newest_out_of_order(folder, k1)
    second = harness.run(_session, case["n_resume"], target, setup,
                         given_to_ranks(case, case["n_resume"], k1, k2, True), folder, k2, True, False, True,
                         probes=[shared], reuse=True).values
    return folder, saving.values, second, saving.trace


def _check_committed(folder, step, why):
    marker = os.path.join(folder, f"step_{step}", "COMMIT")
    harness.check(os.path.isfile(marker),
                  f"{why}, but {os.path.relpath(marker, os.path.dirname(folder))} does not exist: a checkpoint is "
                  f"complete once its folder step_<k> holds the commit marker COMMIT, written last by one rank")


def _compare(got, want, what, rank, step):
    harness.assert_close(got, want, what, rank=rank, step=step, atol=ATOL, rtol=RTOL)


# ---- training equals uninterrupted training -----------------------------------------------------

@hs.fewer_examples(0.3)
@example(case=_RESUME_EXAMPLE)
@given(case=resume_cases())
def test_resume_on_another_world_size_matches_uninterrupted(target, record_property, case, shared):
    """Train k1 steps on N ranks (saving after each), resume on M != N ranks, train k2 more: the parameters
    equal uninterrupted single-process training after every step, on every rank; every step of the saving
    run costs one gradient reduction and one all_gather of the shards (the cost model)."""
    folder, first, second, trace = _save_then_resume(target, case, shared)
    k1, k2 = case["k1"], case["k2"]
    _check_committed(folder, k1, f"save() returned on every rank after step {k1}")
    expected = oracle(case, k1 + k2)
    for rank, out in enumerate(first):
        for step, got in enumerate(out["history"]):
            _compare(got, expected[step]["params"], f"parameters (flattened) before any resume ({_describe(case)})",
                     rank, step)
    for rank, out in enumerate(second):
        harness.check(out["start"] == k1,
                      f"resume() returned step {out['start']}; the complete checkpoints are steps 1..{k1}, and the "
                      f"newest (the largest step, compared as a number) is {k1}, though its files are 60 s older "
                      "than the others' (as an out-of-order copy leaves them): choose by step, never by file time",
                      rank=rank)
        _compare(out["resumed_params"], expected[k1 - 1]["params"],
                 f"parameters right after resume() from step {k1} ({_describe(case)})", rank, k1)
        for i, got in enumerate(out["history"]):
            _compare(got, expected[k1 + i]["params"],
                     f"parameters after resuming from step {k1} and training {i + 1} more step(s) "
                     f"({_describe(case)}); the data order, the dropout generator and the optimizer state must all "
                     "continue exactly where the saved run stopped", rank, k1 + i)
    check_step_cost(record_property, trace, case, expected[0]["params"].numel())


def check_step_cost(record_property, trace, case, numel):
    """The cost model of one ZeRO-1 step on N ranks: a reduction of the flat gradient (all_reduce or
    reduce_scatter, at most N·S elements in) and an all_gather of the S-element shards; nothing else."""
    n, elem = case["n_save"], 8        # the tests' models are float64
    bound = (n + 1) * shard_size(numel, n) * elem
    worst = (0, 0)                      # (bytes per rank, messages per rank) of the busiest rank and step
    for rank in range(n):
        for step in range(case["k1"]):
            ops = trace.ops(rank, phase="train", step=step)
            sent = sum(op.in_bytes for op in ops)
            what = f"train_step() {step} on rank {rank} of {n} ({_describe(case)}, P = {numel})"
            harness.check(len(ops) == 2 or (n == 1 and not ops),
                          f"{what} issued {len(ops)} collectives ({'; '.join(op.describe() for op in ops)}); the "
                          "cost model's messages per rank is 2: one reduction of the flat gradient (all_reduce or "
                          "reduce_scatter), one all_gather of the updated shards", rank=rank, step=step)
            harness.check(sent <= bound,
                          f"{what} sent {sent} bytes; the cost model's bytes per rank is at most "
                          f"(N+1) · ceil(P/N) · elem_size = {bound}: the gradient reduction takes at most the "
                          f"N·S padded elements, the all_gather only this rank's S. Gather the updated shards, not "
                          "whole parameter vectors", rank=rank, step=step)
            worst = max(worst, (sent, len(ops)))
    cost.record(record_property, _describe(case), numel * n, bytes_per_rank=(bound, worst[0]),
                messages_per_rank=(2, worst[1]))


@hs.fewer_examples(0.3)
@example(case=_RESUME_EXAMPLE)
@given(case=resume_cases())
def test_optimizer_state_is_resharded(target, case, shared):
    """After resume on M ranks, rank r's local optimizer holds exactly its slice [r*S, (r+1)*S) of the flat
    parameters and of every optimizer state (S = ceil(P / M)), equal to an uninterrupted run's, then and after
    k2 more steps."""
    _, _, second, _ = _save_then_resume(target, case, shared)
    k1, k2, m = case["k1"], case["k2"], case["n_resume"]
    expected = oracle(case, k1 + k2)
    numel = expected[0]["params"].numel()
    s = shard_size(numel, m)
    for rank, out in enumerate(second):
        real = owned_real(numel, m, rank)
        lo = rank * s
        for when, view, want in (("right after resume()", out["resumed_optimizer"], expected[k1 - 1]),
                                 (f"after {k2} more step(s)", out["optimizer"], expected[k1 + k2 - 1])):
            where = f"trainer.local_optimizer on {m} rank(s) {when} (saved on {case['n_save']})"
            harness.check(view["is_optimizer"], f"{where} is not a torch.optim.Optimizer", rank=rank)
            held = view["params"].numel()
            harness.check(held <= s, f"{where} holds {held} parameter elements; with P={numel} over {m} ranks a "
                                     f"shard is S=ceil(P/M)={s}", rank=rank)
            harness.check(held >= real, f"{where} holds {held} parameter elements; rank {rank} owns "
                                        f"[{lo}, {lo + real}) of the flat parameters", rank=rank)
            harness.assert_close(view["params"][:real], want["params"][lo:lo + real],
                                 f"{where}: its parameter against slice [{lo}, {lo + real}) of the flat parameters",
                                 rank=rank, atol=ATOL, rtol=RTOL)
            harness.check(sorted(view["state"]) == sorted(want["state"]),
                          f"{where} keeps per-element state {sorted(view['state'])}; {case['optimizer']} keeps "
                          f"{sorted(want['state'])}: the optimizer state was not restored", rank=rank)
            for key, got in view["state"].items():
                harness.check(got.numel() >= real, f"{where}: state {key!r} has {got.numel()} elements, fewer than "
                                                    f"the {real} this rank owns", rank=rank)
                harness.assert_close(got[:real], want["state"][key][lo:lo + real],
                                     f"{where}: state {key!r} against slice [{lo}, {lo + real}) of the uninterrupted "
                                     f"run's flat {key!r} (re-shard the saved state for this world)",
                                     rank=rank, atol=ATOL, rtol=RTOL)
            for key, value in want["scalars"].items():
                got = view["scalars"].get(key)
                harness.check(got == value, f"{where}: state {key!r} is {got}, expected {value}", rank=rank)


# ---- the data position --------------------------------------------------------------------------

@hs.fewer_examples(0.3)
@example(case=_RESUME_EXAMPLE)
@given(case=resume_cases())
def test_every_sample_once_per_epoch_across_the_resume(target, case, shared):
    """Across the resume, each step's ranks together fetch exactly that step's global batch of the seeded
    epoch order: no sample skipped, none seen twice in an epoch, the partial last batch included."""
    _, first, second, _ = _save_then_resume(target, case, shared)
    n, big_b, k1 = case["n"], case["global_batch"], case["k1"]
    seen = {}
    for step in range(k1 + case["k2"]):
        outs, where = (first, f"on {case['n_save']} rank(s), before the save") if step < k1 else \
            (second, f"on {case['n_resume']} rank(s), after resuming from step {k1}")
        local = step if step < k1 else step - k1
        fetched = {rank: out["fetched"][local] for rank, out in enumerate(outs)}
        epoch, batch = epoch_batches(n, big_b, case["seed"], step)
        got = sorted(i for idx in fetched.values() for i in idx)
        per_epoch = -(-n // big_b)
        for i in got:
            if i in seen and seen[i][0] == epoch:
                harness.check(False, f"step {step} ({where}) fetched sample {i}, already seen at step {seen[i][1]} "
                                     f"of epoch {epoch}: a sample is seen once per epoch ({n} samples, global batch "
                                     f"{big_b}, {per_epoch} steps per epoch)", step=step)
        missing = sorted(set(batch) - set(got))
        harness.check(got == sorted(batch),
                      f"step {step} ({where}) is batch {step % per_epoch} of epoch {epoch}: the ranks together "
                      f"fetched {got} (per rank {fetched}); the seeded order's batch is {sorted(batch)}"
                      + (f", so {missing} are skipped" if missing else "")
                      + f" ({n} samples, global batch {big_b}, the last batch of an epoch has "
                        f"{n - (per_epoch - 1) * big_b})", step=step)
        for i in got:
            seen[i] = (epoch, step)


# ---- a rank killed while saving -----------------------------------------------------------------

@st.composite
def kill_cases(draw):
    case = draw(resume_cases())
    case["k1"] = min(case["k1"], 3)
    case["k2"] = 1
    # rank 0 commits: its late events (the marker) are drawn as often as every other rank's
    case["kill_rank"] = draw(st.sampled_from([0] * case["n_save"] + list(range(case["n_save"]))))
    case["kill_event"] = draw(st.integers(1, 6))
    return case


_KILL_EXAMPLE = dict(n_save=2, n_resume=1, widths=[2, 3], n=5, global_batch=2, k1=1, k2=1,
                     optimizer=OptimizerSpec("Adam", {"lr": 0.1}), dropout=0.5, seed=3, init_seed=4, data_seed=5)
# The kill tests' overall bound: each case costs three or four fresh worlds (a world that ran a kill is
# never reused), so past this many seconds no new case is drawn (the explicit ones always run first), and
# a failing case is not shrunk (each try would cost as many worlds again).
_KILL_BUDGET_S = 120
_kill_settings = settings(hs.fewer_examples(0.3, minimum=4), phases=[Phase.explicit, Phase.reuse, Phase.generate])


@pytest.fixture
def kill_budget():
    """The moment a kill test stops drawing new cases (one per test: hypothesis's examples share it)."""
    return time.monotonic() + _KILL_BUDGET_S


def _within(budget):
    if time.monotonic() > budget:
        reject()


@_kill_settings
@example(case=dict(_KILL_EXAMPLE, kill_rank=0, kill_event=5))
@example(case=dict(_KILL_EXAMPLE, kill_rank=1, kill_event=2))
@given(case=kill_cases())
def test_killed_save_leaves_the_last_complete_checkpoint(target, case, shared, request, kill_budget):
    """A rank SIGKILLed in the middle of save() leaves the previous checkpoint loadable: resume gives the newest
    complete checkpoint (the torn one is ignored) with exactly its state."""
    _within(kill_budget)
    folder = _folder(shared, "kill", request.node.nodeid, case, os.urandom(8))
    k1, n, setup = case["k1"], case["n_save"], trainer_setup(case)
    harness.run(_session, n, target, setup, given_to_ranks(case, n, 0, k1, False), folder, k1, False, True,
                probes=[shared])
    _check_committed(folder, k1, f"save() returned on every rank after step {k1}")
    kill = harness.KillAt(rank=case["kill_rank"], event=case["kill_event"], under=folder)
    during = harness.run(_session, n, target, setup, given_to_ranks(case, n, k1, 1, True), folder, 1, True, True,
                         probes=[shared, kill])
    if during.killed is None:
        _check_committed(folder, k1 + 1, f"resume(), one step and save() returned on every rank after step {k1 + 1}")
    complete = os.path.isfile(os.path.join(folder, f"step_{k1 + 1}", "COMMIT"))
    want = k1 + 1 if complete else k1
    killed = (f"rank {during.killed.rank} of {n} was killed at {during.killed.event} while saving step {k1 + 1}"
              if during.killed else f"no kill fired (the save of step {k1 + 1} completed)")
    _check_resumes_from(target, case, shared, folder, want, killed, complete)


def _check_resumes_from(target, case, shared, folder, want, killed, complete):
    """resume() on M ranks returns step ``want`` with exactly its state, and one more step trains on from it."""
    k1 = case["k1"]
    expected = oracle(case, want + 1)
    after = harness.run(_session, case["n_resume"], target, trainer_setup(case),
                        given_to_ranks(case, case["n_resume"], want, 1, True), folder, 1, True, False, catch=True,
                        probes=[shared]).values
    for rank, out in enumerate(after):
        harness.check("resume_error" not in out,
                      f"{killed}; step_{k1 + 1}/COMMIT {'exists' if complete else 'does not exist'}, so the newest "
                      f"complete checkpoint is step {want}, but resume() on {case['n_resume']} rank(s) raised "
                      f"{out.get('resume_error')}", rank=rank)
        harness.check(out["start"] == want,
                      f"{killed}; step_{k1 + 1}/COMMIT {'exists' if complete else 'does not exist'}, so the newest "
                      f"complete checkpoint is step {want}, but resume() on {case['n_resume']} rank(s) returned "
                      f"step {out['start']}", rank=rank)
        _compare(out["resumed_params"], expected[want - 1]["params"],
                 f"parameters right after resume() ({killed}; resumed from step {want})", rank, want)
        _compare(out["history"][0], expected[want]["params"],
                 f"parameters one step after resume() ({killed}; resumed from step {want}, {_describe(case)})",
                 rank, want)


def _tear(killed, folder, whole):
    """Leave the file the killed rank was about to write as a kill in the middle of that write leaves it: under
    the name being written, a prefix of its bytes (half of what the uninterrupted save wrote there, from
    ``whole``; filler bytes for a name that save did not keep).  Returns the file's path, or None when the
    kill came before some other event (a rename, a mkdir, a remove), where nothing is half-written."""
    if killed is None or killed.written is None:
        return None
    path = os.path.join(os.path.dirname(os.path.realpath(folder)), killed.written)
    kept = os.path.join(whole, os.path.relpath(path, os.path.realpath(folder)))
    data = open(kept, "rb").read() if os.path.isfile(kept) else b"\x80 half of a file " * 16
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    return path


@_kill_settings
@example(case=dict(_KILL_EXAMPLE, kill_rank=0, kill_event=3))   # COMMIT's write, in a save that never renames
@example(case=dict(_KILL_EXAMPLE, kill_rank=1, kill_event=2))
@given(case=kill_cases())
def test_save_killed_mid_write_keeps_the_previous_checkpoint(target, case, shared, request, kill_budget):
    """A rank SIGKILLed in the middle of writing a file of its save, leaving that file half-written under the name
    it was writing, leaves the previous checkpoint the newest complete one: a file under its final name is always
    whole (written under a temporary name, then renamed), above all COMMIT."""
    _within(kill_budget)
    k1, n, setup = case["k1"], case["n_save"], trainer_setup(case)
    folder = _folder(shared, "torn", request.node.nodeid, case, os.urandom(8))
    harness.run(_session, n, target, setup, given_to_ranks(case, n, 0, k1, False), folder, k1, False, True,
                probes=[shared])
    _check_committed(folder, k1, f"save() returned on every rank after step {k1}")
    whole = _folder(shared, "whole", request.node.nodeid, case, os.urandom(8))
    shutil.copytree(folder, whole, dirs_exist_ok=True)   # for the same save, uninterrupted: the bytes it writes
    kill = harness.KillAt(rank=case["kill_rank"], event=case["kill_event"], under=folder)
    later = given_to_ranks(case, n, k1, 1, True)
    during = harness.run(_session, n, target, setup, later, folder, 1, True, True, probes=[shared, kill])
    torn = None
    if during.killed is not None and during.killed.written is not None:
        harness.run(_session, n, target, setup, later, whole, 1, True, True, probes=[shared])
        torn = _tear(during.killed, folder, whole)
    marker = os.path.join(os.path.realpath(folder), f"step_{k1 + 1}", "COMMIT")
    killed = (f"rank {during.killed.rank} of {n} was killed while saving step {k1 + 1}, "
              + (f"in the middle of writing {os.path.relpath(torn, os.path.realpath(folder))} (left with half "
                 "its bytes)" if torn
                 else f"at {during.killed.event}") if during.killed else f"no kill fired (step {k1 + 1} was saved)")
    harness.check(torn != marker,
                  f"{killed}: COMMIT was being written under its final name, so a half-written COMMIT now says "
                  f"step {k1 + 1} is complete. Write COMMIT.tmp, then os.replace it to COMMIT: then COMMIT exists "
                  "whole or not at all")
    complete = os.path.isfile(marker)
    _check_resumes_from(target, case, shared, folder, k1 + 1 if complete else k1, killed, complete)


@st.composite
def commit_cases(draw):
    case = draw(resume_cases().filter(lambda c: c["n_save"] >= 2))
    case["kill_rank"] = draw(st.sampled_from([0] * case["n_save"] + list(range(case["n_save"]))))
    case["kill_event"] = draw(st.integers(1, 6))
    return case


@hs.fewer_examples(0.3, minimum=4)
@example(case=dict(_KILL_EXAMPLE, kill_rank=0, kill_event=4))
@example(case=dict(_KILL_EXAMPLE, kill_rank=0, kill_event=5))
@given(case=commit_cases())
def test_save_returns_once_committed(target, case, shared, request):
    """save() returns on a rank only once its checkpoint is committed: when a rank is killed during the first
    save (the one that commits, before COMMIT exists), no rank returns from save() without COMMIT."""
    folder = _folder(shared, "commit", request.node.nodeid, case, os.urandom(8))
    n = case["n_save"]
    kill = harness.KillAt(rank=case["kill_rank"], event=case["kill_event"], under=folder)
    during = harness.run(_session, n, target, trainer_setup(case), given_to_ranks(case, n, 0, 1, False), folder, 1,
                         False, True, probes=[shared, kill])
    killed = (f"rank {during.killed.rank} of {n} was killed at {during.killed.event}" if during.killed
              else "no kill fired")
    for rank, out in enumerate(during.values):
        if out is None:
            continue                    # killed, or still inside save() when the call ended: right
        harness.check(out["committed"] == [True],
                      f"save(directory, 1) returned on rank {rank} while step_1/COMMIT did not exist ({killed}): "
                      "save() ends with a barrier after COMMIT is in place, so that once it returns, on any rank, "
                      f"the checkpoint is complete ({_describe(case)})", rank=rank)


# ---- a damaged checkpoint -----------------------------------------------------------------------

def _try_resume(target, setup, given, empty, damaged):
    """resume() on an empty folder, then on the damaged checkpoint: what each raised (or returned)."""
    m = target.load()
    seen = []
    for directory in (empty, damaged):
        trainer, _ = _trainer(m, setup, dict(given, model=copy.deepcopy(given["model"])))
        try:
            step = trainer.resume(directory)
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 -- reported back to the test process
            error = getattr(m, "CheckpointError", None)
            seen.append({"raised": type(e).__name__, "message": str(e),
                         "is_checkpoint_error": isinstance(error, type) and isinstance(e, error),
                         "is_runtime_error": isinstance(e, RuntimeError)})
        else:
            seen.append({"raised": None, "step": step})
        dist.barrier()
    return seen


@st.composite
def damage_cases(draw):
    case = draw(resume_cases())
    case["k1"] = min(case["k1"], 3)
    case["damage"] = draw(st.sampled_from(["deleted", "truncated", "one byte flipped in"]))
    case["pick"] = draw(st.integers(0, 1000))
    case["where"] = draw(st.floats(0, 1))
    return case


def listed_files(step_folder):
    """The checkpoint's files: those under step_<k>/ (COMMIT aside) whose name, their path from step_<k>/, COMMIT
    contains as a whole name.  A file that COMMIT does not name (a leftover temporary file) is no part of it."""
    with open(os.path.join(step_folder, "COMMIT"), "rb") as f:
        marker = f.read()
    named = []
    for path in _paths_under(step_folder):
        name = os.path.relpath(path, step_folder)
        if os.path.isfile(path) and name != "COMMIT" and \
                re.search(rb"(?<![\w.-])" + re.escape(name.encode()) + rb"(?![\w.-])", marker):
            named.append(name)
    return sorted(named)


def _damage(path, how, where):
    if how == "deleted":
        os.remove(path)
        return
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if how == "truncated":
        data = data[:int(len(data) * where * 0.9)]
    elif data:
        i = min(int(len(data) * where), len(data) - 1)
        data[i] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)


@hs.fewer_examples(0.3)
@example(case=dict(_KILL_EXAMPLE, k1=2, damage="one byte flipped in", pick=0, where=0.5))
@given(case=damage_cases())
def test_damaged_checkpoint_raises_checkpoint_error_naming_the_file(target, case, shared, request):
    """A checkpoint with a file missing, truncated or altered makes resume() raise CheckpointError (a
    RuntimeError) naming that file, on every rank, never a wrong resume; so does a folder with no complete one."""
    folder = _folder(shared, "damage", request.node.nodeid, case, os.urandom(8))
    empty = _folder(shared, "empty", request.node.nodeid, case, os.urandom(8))
    k1 = case["k1"]
    harness.run(_session, case["n_save"], target, trainer_setup(case),
                given_to_ranks(case, case["n_save"], 0, k1, False), folder, k1, False, True, probes=[shared])
    _check_committed(folder, k1, f"save() returned on every rank after step {k1}")
    newest = os.path.join(folder, f"step_{k1}")
    files = listed_files(newest)
    harness.check(bool(files), f"step_{k1}/COMMIT names none of the files in step_{k1}/ "
                  f"({sorted(os.listdir(newest))}): COMMIT lists every file of the checkpoint by name")
    name = files[case["pick"] % len(files)]
    _damage(os.path.join(newest, name), case["damage"], case["where"])
    what = f"step_{k1}/{name} {case['damage']} (saved on {case['n_save']} rank(s))"
    seen = harness.run(_try_resume, case["n_resume"], target, trainer_setup(case),
                       given_to_ranks(case, case["n_resume"], k1, 0, True), empty, folder, probes=[shared]).values
    for rank, (on_empty, on_damaged) in enumerate(seen):
        for got, situation, named in ((on_empty, "a folder with no checkpoint", None),
                                      (on_damaged, f"a checkpoint with {what}", name)):
            harness.check(got["raised"] is not None,
                          f"resume() on {situation} returned step {got.get('step')}: it must raise CheckpointError "
                          "rather than resume from what it cannot trust", rank=rank)
            harness.check(got["is_checkpoint_error"] and got["is_runtime_error"],
                          f"resume() on {situation} raised {got['raised']}({got['message']!r}); it must raise "
                          "CheckpointError, a subclass of RuntimeError", rank=rank)
            if named is not None:
                harness.check(named in got["message"],
                              f"resume() on {situation} raised CheckpointError({got['message']!r}): the message must "
                              f"name the file, {named}", rank=rank)
