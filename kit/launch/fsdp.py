"""Fully sharded data parallel (ZeRO-3): your FullyShardedModel beside torch's FSDP2 ``fully_shard``.

Each rank keeps only its 1/N of every unit's parameters (each Linear is a unit).  A unit's full
parameters exist only while it computes:

    forward, per unit:   all_gather(S_u from each rank) -> compute -> free the full parameters
    backward, per unit:  all_gather(S_u) again -> compute the gradient -> reduce_scatter(P_u) -> free

each gather issued one unit ahead, so it travels while the unit before computes.  A rank hands in
its S_u twice (the two gathers) and the unit's whole gradient once (the reduce-scatter): P(1 + 2/N)
bytes a step, for full parameters of at most two units at a time instead of the whole model's.  torch's side shards each unit, then the
root, and prefetches one unit ahead in the forward as your contract does (it does in the backward by itself).
"""
from __future__ import annotations

from . import mlp
from .measure import Comparison, Contender


def comparisons(mine, device) -> list:
    def yours():
        fsdp = mine.FullyShardedModel(mlp.make_model(device))
        return _training(fsdp, mlp.adam(fsdp.parameters()), device)

    def torch_fsdp2():
        from torch.distributed.fsdp import fully_shard
        model = mlp.make_model(device)
        units = [unit for unit in model if list(unit.parameters())]
        for unit in units:
            fully_shard(unit)
        fully_shard(model)
        for unit, after in zip(units, units[1:]):
            unit.set_modules_to_forward_prefetch([after])
        return _training(model, mlp.adam(model.parameters()), device)

    return [Comparison(Contender("torch  FSDP2 fully_shard", torch_fsdp2),
                       [Contender("yours  FullyShardedModel", yours)])]


def _training(model, opt, device):
    def step(i):
        x, y = mlp.batch(i, device)
        opt.zero_grad(set_to_none=True)
        mlp.loss_fn(model(x), y).backward()   # gathers and reduce-scatters inside, unit by unit
        opt.step()                            # on the shards only
    return step
