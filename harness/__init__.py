"""The multi-rank engine under every problem: run code on N real ranks, traced.

Public API -- problems, the test helpers and the judge app use only these names:

    run(fn, world_size, *args, timeout=, forbid=, allow=, backend=, memory_gb=, reuse=, probes=[...])
                                  -> RunResult(values, trace, probes, killed; .flops, .memory)
    Compute(), Flops(), Perturb(rank, nth_send), SharedFolder(path=None), KillAt(rank, event), Killed, Probe
                                  the probes of a call (``harness.probes``): compute between an op's issue and
                                  its wait, FLOPs, a changed message, a folder the ranks share, a rank killed
                                  at its n-th file event
    per_rank(values), PerRank     an argument of run that rank r receives as values[r], and no other rank sees
    defaults(**fields)            a context manager: what run uses for what a call leaves out, for the block;
                                  the fields are RunDefaults's (forbid, allow, timeout, stop_on_hang, backend,
                                  memory_gb, on_trace: called with each successful call's Trace,
                                  audit_devices: the device audit, world_sizes: the sizes calls may use,
                                  probes: every call's probes, hidden: paths no rank may read, landlock)
    protections()                 what confined the ranks so far, and whether it was all in force (``sealed``)
    protections_here()            what this machine allows, before any world starts (the same form)
    pick_backend(world_size, backend="auto"), shutdown(), prestart()   the pool: its backend, stopping it,
                                  starting the torch-preloaded forkserver early
    phase(name, step=None)        mark a region inside a rank function
    device(), gpu_count()         this rank's device (cuda:rank under NCCL, else cpu); the GPUs here
    Target, reference_of          the learner's file (loaded inside the ranks); a reference beside a wrong version
    assert_close, check, PropertyFailed      plain-words property checks
    expect_type(value, "list[list[int]]", "make_buckets(sizes, cap)"), WrongType
                                  a returned value against the contract's type
    live_tensor_bytes, live_storages, saved_for_backward   tensor memory a rank holds, found through gc and autograd
    hold(*objects)                what a rank function keeps alive past its call's end, for ``RunResult.memory``
    recording()                   a context manager: the same tracer in a process the harness did not start
                                  (a rank under torchrun); yields the list of the block's CommOps
    CommOp, PhaseSpan, Trace, to_chrome      the trace of a call, and the same as Chrome trace-event JSON
    errors: HarnessError, HangError, HangStopped, RankError, NotImplementedYet, RankCrashed, ForbiddenOp,
            TraceTampered, TargetError, BackendUnavailable, WorldSkipped, raised_by_stub
                                  (``harness.errors`` is public too; a rank's
            failure renders its whole report with ``exc.render()``)

The engine reads no environment variable and imports nothing from the judge app: its
configuration comes in through ``defaults``.  Names load lazily, so importing ``harness``
does not import torch.
"""
import importlib

_EXPORTS = {
    "run": "pool", "RunResult": "pool", "pick_backend": "pool", "shutdown": "pool", "protections": "pool", "protections_here": "sandbox.status",
    "per_rank": "inputs", "PerRank": "inputs",
    "defaults": "config", "RunDefaults": "config",
    "prestart": "world.boot",
    "phase": "record.phases",
    "device": "devices", "Target": "target", "reference_of": "target",
    "assert_close": "properties", "check": "properties", "PropertyFailed": "properties",
    "expect_type": "properties", "WrongType": "properties",
    "live_tensor_bytes": "memory", "hold": "held", "live_storages": "memory", "saved_for_backward": "memory",
    "recording": "outside", "CommOp": "trace", "PhaseSpan": "trace", "Trace": "trace", "to_chrome": "timeline",
    "HarnessError": "errors", "HangError": "errors", "HangStopped": "errors", "RankError": "errors",
    "NotImplementedYet": "errors", "RankCrashed": "errors", "ForbiddenOp": "errors", "TraceTampered": "errors",
    "TargetError": "errors", "raised_by_stub": "errors", "BackendUnavailable": "errors", "WorldSkipped": "errors",
    "gpu_count": "devices", "KillAt": "probes", "Killed": "probes", "Compute": "probes", "Flops": "probes",
    "Perturb": "probes", "SharedFolder": "probes", "Probe": "probes",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
