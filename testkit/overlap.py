"""Communication overlapped with compute, read from the trace of a call that counts compute (``harness.Compute``).

    check_receives_overlap_compute(trace, ranks, phase, call, travelling)
        every receive a phase issued was waited on, with compute ops run between its posting and that wait

Ring attention posts the next K/V hop, computes with what it holds, and only then waits (problems 119, 123).
The harness counts the compute ops (matmul, exp, softmax, fused attention) each rank ran between issuing an op
and starting to wait on it (``CommOp.compute_between``); a wait in the statement that posted it counts 0.
"""
from __future__ import annotations

import harness


def check_receives_overlap_compute(trace, ranks, phase: str, call: str, travelling: str):
    """``call``: the call in words, for the failure; ``travelling``: what each message is ("chunk", "shard")."""
    for rank in ranks:
        for op in trace.ops(rank, "recv", phase=phase):
            harness.check(op.wait_start is not None, f"{call}: {phase} issued {op.describe()} and never waited on it",
                          rank=rank)
            harness.check(bool(op.compute_between),
                          f"{call}: {phase} issued {op.describe()}, then waited for it with no attention compute in "
                          f"between ({op.compute_between or 0} matmul/exp ops): post the next {travelling}'s "
                          f"isend/irecv, compute with the {travelling} you already hold, and only then wait, so "
                          f"that the next {travelling} travels while the rank computes", rank=rank)
