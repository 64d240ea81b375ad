"""``python -m kit.launch N [--target FILE | --solution] [--steps S] [--backend gloo|nccl] [torchrun args]``

Runs your implementation of problem N for real, under torchrun, on a small seeded workload (an
MLP on random data, or one tensor for the collectives), beside torch's own implementation of the
same thing, and prints per-step figures for both and their ratio.  A measurement, not a grade.

    __main__   the command line: the problem, its file, torchrun's arguments (SLURM's mapped by
               ``slurm``); it execs ``python -m torch.distributed.run ... -m kit.launch.worker``
    worker     what each torchrun rank runs: the process group, your file, the workload, the table
    measure    one contender's figures (step time, bytes, exposed communication, peak memory), the table
    mlp        the model, the data and the optimizer every training workload shares
    allreduce, ddp, zero, fsdp, pipeline   one workload each: your implementation and torch's, side by side

Which workload measures a problem is chosen by the public names its file defines (``WORKLOADS``),
the API the workload calls, so nothing here names a problem by number.

The figures come from the engine's own tracer, ``harness.recording()``: the dispatcher kernels that
record every c10d op in a harness rank, installed in a process the harness did not start.  A second
op tracer here would be worse and could disagree with the judge's trace: patched ``torch.distributed``
functions miss DistributedDataParallel's C++ reducer, and a TorchDispatchMode slows every tensor op,
which the step times would then carry.  One narrow public entry to the engine keeps a single
definition of an op's bytes and waits.
"""
from __future__ import annotations

# the public names a problem's file defines -> the workload that calls them (kit/launch/<module>.py:<function>)
WORKLOADS = (
    (("ring_all_reduce", "ring_reduce_scatter", "ring_all_gather"), "allreduce", "comparisons"),
    (("BucketedDDP",), "ddp", "bucketed_comparisons"),
    (("AccumulatingDDP", "train_step"), "ddp", "accumulating_comparisons"),
    (("ShardedOptimizer",), "zero", "comparisons"),
    (("FullyShardedModel",), "fsdp", "comparisons"),
    (("schedule_1f1b", "run_pipeline"), "pipeline", "comparisons"),
    (("interleaved_schedule", "run_interleaved"), "pipeline", "interleaved_comparisons"),
    (("schedule_zb_h1", "run_zero_bubble"), "pipeline", "zero_bubble_comparisons"),
)


def workload_for(problem) -> tuple | None:
    """(module, function) of the workload for ``problem`` (a catalogue entry), or None."""
    for names, module, function in WORKLOADS:
        if set(names) <= set(problem.names):
            return module, function
    return None


def problems_with_a_workload(problems: dict) -> list:
    return sorted(number for number, problem in problems.items() if workload_for(problem) is not None)
