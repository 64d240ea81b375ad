"""Pipeline parallel: your 1F1B, interleaved 1F1B and zero-bubble (ZB-H1) pipelines beside
torch.distributed.pipelining's Schedule1F1B, ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble.

Rank s holds stage s of the model (Linear, Tanh, Linear) and the batch is cut into m micro-batches.
A forward of micro-batch i receives its input from stage s-1 and sends its output to stage s+1; a
backward receives the output's gradient from stage s+1 and sends the input's gradient to stage s-1.
1F1B starts p-1-s forwards, then alternates one forward and one backward, so a stage holds at most
p-s micro-batches' activations.  Each stage but the last sends m activations, each but the first
m gradients: bytes depend only on m and the activation's size, the schedule decides the idle time.
Interleaved, rank r holds v stages, r, r+p, ..., and a micro-batch goes round the ring v times:
v times the messages, for a bubble v times smaller.  Zero bubble splits each backward in two, the
input's gradient (B, on the critical path: sent at once) and the weights' (W, run later to fill
the idle slots).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from . import mlp
from .measure import Comparison, Contender

WIDTH = 1024          # every stage maps WIDTH features to WIDTH
MICRO_BATCHES_PER_RANK = 2   # m = 2p, a multiple of p as the interleaved schedule needs
ROWS = 16             # per micro-batch
CHUNKS = 2            # stages per rank, interleaved


def describe() -> str:
    return (f"stages of Linear {WIDTH}-{WIDTH}, Tanh, Linear {WIDTH}-{WIDTH} (float32), one per rank "
            f"({CHUNKS} interleaved), {_micro_batches()} micro-batches of {ROWS} rows per step, Adam")


def _micro_batches() -> int:
    return MICRO_BATCHES_PER_RANK * dist.get_world_size()


def _stage(device, index=None) -> nn.Sequential:
    torch.manual_seed(mlp.SEED + (dist.get_rank() if index is None else index))
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH)).to(device)


def _batch(step: int, device) -> tuple:
    """The whole step's (x, y): stage 0 uses x, the last stage y."""
    g = torch.Generator().manual_seed(mlp.SEED + 1 + step)
    x, y = (torch.randn(_micro_batches() * ROWS, WIDTH, generator=g) for _ in range(2))
    return x.to(device), y.to(device)


def comparisons(mine, device) -> list:
    return _one_stage_per_rank(device, mine.schedule_1f1b, mine.run_pipeline, "yours  schedule_1f1b + run_pipeline",
                               "Schedule1F1B")


def _one_stage_per_rank(device, schedule, run, label: str, torch_name: str) -> list:
    """``run(stage_module, schedule(p, m)[rank], act_shape, inputs, targets, loss_fn)`` beside torch's ``torch_name``."""
    stage, stages = dist.get_rank(), dist.get_world_size()
    first, last = stage == 0, stage == stages - 1

    def yours():
        module = _stage(device)
        opt, ops = mlp.adam(module.parameters()), schedule(stages, _micro_batches())[stage]

        def step(i):
            x, y = _batch(i, device)
            opt.zero_grad()
            run(module, ops, (ROWS, WIDTH), inputs=list(x.chunk(_micro_batches())) if first else None,
                targets=list(y.chunk(_micro_batches())) if last else None, loss_fn=mlp.loss_fn)
            opt.step()
        return step

    return [Comparison(Contender(f"torch  pipelining.{torch_name}", _torch_schedule(torch_name, device)),
                       [Contender(label, yours)])]


def interleaved_comparisons(mine, device) -> list:
    rank, ranks = dist.get_rank(), dist.get_world_size()

    def yours():
        chunks = [_stage(device, rank + c * ranks) for c in range(CHUNKS)]
        opt = mlp.adam([p for chunk in chunks for p in chunk.parameters()])
        schedule = mine.interleaved_schedule(ranks, _micro_batches(), CHUNKS)

        def step(i):
            x, y = _batch(i, device)
            m = _micro_batches()
            pairs = list(zip(x.chunk(m) if rank == 0 else [None] * m, y.chunk(m) if rank == ranks - 1 else [None] * m))
            opt.zero_grad()
            mine.run_interleaved(chunks, schedule, pairs if rank in (0, ranks - 1) else None, (ROWS, WIDTH),
                                 mlp.loss_fn)
            opt.step()
        return step

    return [Comparison(Contender("torch  pipelining.ScheduleInterleaved1F1B",
                                 _torch_schedule("ScheduleInterleaved1F1B", device, CHUNKS)),
                       [Contender("yours  interleaved_schedule + run_interleaved", yours)])]


def zero_bubble_comparisons(mine, device) -> list:
    return _one_stage_per_rank(device, mine.schedule_zb_h1, mine.run_zero_bubble,
                               "yours  schedule_zb_h1 + run_zero_bubble", "ScheduleInterleavedZeroBubble")


def _torch_schedule(name: str, device, chunks: int = 1):
    """torch's schedule ``name`` over this rank's ``chunks`` stages (r, r+p, ...): its gradients are scaled by 1/m."""
    def build():
        from torch.distributed import pipelining
        rank, ranks = dist.get_rank(), dist.get_world_size()
        modules = [_stage(device, rank + c * ranks) for c in range(chunks)]
        stages = [pipelining.PipelineStage(module, rank + c * ranks, ranks * chunks, device)
                  for c, module in enumerate(modules)]
        opt = mlp.adam([p for module in modules for p in module.parameters()])
        one_stage = getattr(pipelining, name) in (pipelining.Schedule1F1B, pipelining.ScheduleGPipe)
        schedule = getattr(pipelining, name)(stages[0] if one_stage else stages, n_microbatches=_micro_batches(),
                                             loss_fn=mlp.loss_fn)

        def step(i):
            x, y = _batch(i, device)
            opt.zero_grad()
            schedule.step(*([x] if rank == 0 else []), **({"target": y} if rank == ranks - 1 else {}))
            opt.step()
        return step
    return build
