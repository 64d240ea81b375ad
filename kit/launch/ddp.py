"""Data parallel: your BucketedDDP, or AccumulatingDDP and train_step, beside torch's DistributedDataParallel.

Every rank holds the whole model and trains on its own batch.  After backward each gradient is the
average over the ranks: an all_reduce of every gradient byte, once per step, in buckets launched as
backward produces them, so most of it travels while backward still computes.  What is left when
backward returns is the exposed part: BucketedDDP waits for it in ``finish_gradient_sync``, torch's
reducer in C++ at backward's end (timed by ``reducer_wait_seconds``).

With gradient accumulation (k micro-batches a step) only the last backward communicates: the others
run inside ``no_sync()``.
"""
from __future__ import annotations

import contextlib
import time

import torch
from torch.nn.parallel import DistributedDataParallel

from . import mlp
from .measure import Comparison, Contender

BUCKET_BYTES = 1 << 20   # both sides: 1 MiB buckets, so both overlap backward the same way
MICRO_BATCHES = 4        # per step, for gradient accumulation


def bucketed_comparisons(mine, device) -> list:
    def yours():
        model = mlp.make_model(device)
        ddp, opt = mine.BucketedDDP(model, BUCKET_BYTES), mlp.adam(model.parameters())

        def step(i):
            x, y = mlp.batch(i, device)
            opt.zero_grad()
            mlp.loss_fn(ddp(x), y).backward()   # buckets are all-reduced while this runs
            ddp.finish_gradient_sync()          # waits for what is still in flight, averages
            opt.step()
        return step

    def torch_ddp():
        model = mlp.make_model(device)
        ddp, opt = DistributedDataParallel(model, bucket_cap_mb=BUCKET_BYTES / 2**20), mlp.adam(model.parameters())

        def step(i):
            x, y = mlp.batch(i, device)
            opt.zero_grad()
            out = ddp(x)
            waited = reducer_wait_seconds(out)
            mlp.loss_fn(out, y).backward()      # the reducer launches and waits for its buckets inside
            opt.step()
            return sum(waited)
        return step

    return [Comparison(Contender("torch  DistributedDataParallel", torch_ddp),
                       [Contender("yours  BucketedDDP", yours)])]


def accumulating_comparisons(mine, device) -> list:
    def micro_batches(i):
        x, y = mlp.batch(i, device)
        return list(zip(x.chunk(MICRO_BATCHES), y.chunk(MICRO_BATCHES)))

    def yours():
        model = mlp.make_model(device)
        ddp, opt = mine.AccumulatingDDP(model), mlp.adam(model.parameters())

        def step(i):
            mine.train_step(ddp, opt, micro_batches(i), mlp.loss_fn)   # the last backward syncs
        return step

    def torch_ddp():
        model = mlp.make_model(device)
        ddp, opt = DistributedDataParallel(model), mlp.adam(model.parameters())

        def step(i):
            opt.zero_grad()
            batches, waited = micro_batches(i), []
            for j, (x, y) in enumerate(batches):
                last = j == len(batches) - 1
                with contextlib.nullcontext() if last else ddp.no_sync():   # only the last backward syncs
                    out = ddp(x)
                    if last:
                        waited = reducer_wait_seconds(out)
                    (mlp.loss_fn(out, y) / len(batches)).backward()
            opt.step()
            return sum(waited)
        return step

    return [Comparison(Contender("torch  DistributedDataParallel + no_sync", torch_ddp),
                       [Contender("yours  AccumulatingDDP + train_step", yours)])]


def reducer_wait_seconds(output: torch.Tensor) -> list:
    """The time DistributedDataParallel's reducer spends at the end of the backward through ``output``,
    waiting for its buckets (and copying their averages into ``.grad``): filled as that backward ends.

    The reducer waits in C++, in a callback it queues with autograd once its last bucket is launched.
    Autograd runs its end-of-backward callbacks in the order queued, a callback queued by a running one
    included: one queued as backward starts (the output's gradient hook) runs just before the reducer's,
    and the one it queues just after it.
    """
    engine, seconds = torch.autograd.Variable._execution_engine, []

    def before_the_reducer():
        start = time.perf_counter()
        engine.queue_callback(lambda: seconds.append(time.perf_counter() - start))

    output.register_hook(lambda grad: engine.queue_callback(before_the_reducer))
    return seconds
