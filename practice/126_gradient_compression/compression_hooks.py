"""Problem 126: gradient compression as DDP communication hooks.  See README.md for the contract.

Register a hook on torch's DistributedDataParallel:

    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(PowerSGDState(None, matrix_approximation_rank=2, seed=0), powersgd_hook)
    # or bf16, through a lambda: DDP keeps the name bf16_compress_hook for torch's own CUDA hook
    ddp.register_comm_hook(BF16State(None), lambda state, bucket: bf16_compress_hook(state, bucket))

DDP checks a hook's annotations: keep the return annotation below (torch.futures.Future[torch.Tensor])
or none, and do not add ``from __future__ import annotations`` (it turns them into strings DDP refuses).

DDP calls hook(state, bucket) once per gradient bucket during backward.  The hook returns a
torch.futures.Future whose value is bucket.buffer() holding the bucket's gradients averaged
over the group's ranks; DDP writes that into each parameter's .grad.
"""
import torch
import torch.distributed as dist   # noqa: F401  (the hooks all-reduce with async_op=True: a work with get_future())


class BF16State:
    """The state of bf16_compress_hook.

    Attributes:
        process_group: the group to average over (None: the default group).
    """

    def __init__(self, process_group=None):
        raise NotImplementedError


def bf16_compress_hook(state: BF16State, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over the group with the data on the wire in bfloat16.

    Cast bucket.buffer() (float32) to bfloat16, all-reduce that, and copy the result back into the
    float32 buffer: the future's value is bucket.buffer(), float32, holding the average.
    """
    raise NotImplementedError


class PowerSGDState:
    """The state of powersgd_hook.

    Attributes:
        process_group: the group to average over (None: the default group).
        matrix_approximation_rank: r >= 1 (ValueError otherwise); a weight of n x m is sent as
            P (n x r') and Q (m x r') with r' = min(n, m, r).
        seed: Q's initial values come from a torch.Generator seeded with it, identical on every rank.
        Per parameter (kept across steps, keyed by the parameter, not by the bucket): this rank's
        error-feedback buffer, and Q (reused by the next step: warm start).
    """

    def __init__(self, process_group=None, matrix_approximation_rank: int = 1, seed: int = 0):
        raise NotImplementedError


def powersgd_hook(state: PowerSGDState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Rank-r PowerSGD with error feedback over the bucket's gradients.

    Every gradient with 2 or more dimensions, viewed as M (n x m) = grad.view(grad.shape[0], -1):
        M <- M + error;  P = all_reduce(M Q);  P <- orthonormalise(P);
        Q = all_reduce(M^T P) / world;  result = P Q^T;  error <- M - result.
    1-D gradients (biases) are all-reduced exactly and divided by the world size.
    The future's value is bucket.buffer() holding the results.
    """
    raise NotImplementedError
