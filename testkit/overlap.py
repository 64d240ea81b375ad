"""Communication overlapped with compute, read from the trace of a call that counts compute (``harness.Compute``).

    check_receives_overlap_compute(trace, ranks, phase, call, travelling, work=, advice=)
        every receive a phase issued was waited on, with compute the result needed run between its posting
        and that wait

Ring attention posts the next K/V hop, computes with what it holds, and only then waits (problems 119, 123);
collective matmul runs each chunk's matmul while the next chunk travels (129).
The harness counts the compute calls (matmul, exp, softmax, fused attention) each rank ran between issuing an
op and starting to wait on it, and of those the ones whose results the call's returned values came from
(``CommOp.compute_used``): a dummy op there, a sleep, or work on data no output depends on counts nothing.
"""
from __future__ import annotations

import harness


def check_receives_overlap_compute(trace, ranks, phase: str, call: str, travelling: str,
                                   work: str = "attention compute", advice: str = ""):
    """``call``: the call in words, for the failure; ``travelling``: what each message is ("chunk", "shard");
    ``work``: the compute the contract names; ``advice``: what to do instead (a default for ring attention)."""
    advice = advice or (f"post the next {travelling}'s isend/irecv, compute with the {travelling} you already "
                        f"hold, and only then wait, so that the next {travelling} travels while the rank computes")
    for rank in ranks:
        for op in trace.ops(rank, "recv", phase=phase):
            harness.check(op.wait_start is not None, f"{call}: {phase} issued {op.describe()} and never waited on it",
                          rank=rank)
            assert op.compute_used is not None, "the overlap check needs a call that counts compute (harness.Compute)"
            harness.check(op.compute_used > 0,
                          f"{call}: {phase} issued {op.describe()}, then waited for it with no {work} in "
                          f"between that the result needed ({op.compute_between or 0} matmul/exp calls ran, "
                          f"{op.compute_used} of them used by the output): {advice}", rank=rank)
