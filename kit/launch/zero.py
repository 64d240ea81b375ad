"""Sharded optimizer state (ZeRO): your ShardedOptimizer, stage 1 and 2, beside torch's ZeroRedundancyOptimizer.

Every rank holds the whole model, but the optimizer's state (Adam's two moments) only for its 1/N of
the parameters.  A step averages the gradients, each rank updates its shard, and the updated shards
are gathered back into every rank's parameters:

    yours, stage 1:  all_reduce(P gradients)       -> step your S = P/N -> all_gather(S from each)
    yours, stage 2:  reduce_scatter(P gradients)   -> step your S       -> all_gather(S from each)
    torch:           DDP's all_reduce(P gradients) -> step your shard   -> broadcast(your shard to all)

(torch's ZeroRedundancyOptimizer shards whole parameters, so its shards are only roughly P/N.)
"""
from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from . import mlp
from .ddp import reducer_wait_seconds
from .measure import Comparison, Contender


def comparisons(mine, device) -> list:
    def yours(stage):
        def build():
            model = mlp.make_model(device)
            opt = mine.ShardedOptimizer(list(model.parameters()), torch.optim.Adam, stage=stage, lr=mlp.LR)

            def step(i):
                x, y = mlp.batch(i, device)
                opt.zero_grad(set_to_none=True)
                mlp.loss_fn(model(x), y).backward()
                opt.step()   # averages the gradients, steps this rank's shard, gathers every shard
            return step
        return build

    def torch_zero():
        model = mlp.make_model(device)
        ddp = DistributedDataParallel(model)   # averages the gradients, as ZeroRedundancyOptimizer expects
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=mlp.LR)

        def step(i):
            x, y = mlp.batch(i, device)
            opt.zero_grad(set_to_none=True)
            out = ddp(x)
            waited = reducer_wait_seconds(out)
            mlp.loss_fn(out, y).backward()
            opt.step()       # steps this rank's parameters, then broadcasts each from its owner
            return sum(waited)
        return step

    return [Comparison(Contender("torch  ZeroRedundancyOptimizer + DDP", torch_zero),
                       [Contender("yours  ShardedOptimizer stage=1", yours(1), "stage 1 / torch"),
                        Contender("yours  ShardedOptimizer stage=2", yours(2), "stage 2 / torch")])]
