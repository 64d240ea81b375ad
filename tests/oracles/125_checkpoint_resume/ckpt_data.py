"""Problem 125's test helpers: the logged dataset the ranks train on, and the single-process oracle.

The dataset records every index the trainer fetches (``dataset[i]``), so the tests read which samples
each rank consumed from the data actually used, not from anything the trainer reports.
"""
from __future__ import annotations

import math

import torch

from testkit.models import random_mlp


class LoggedDataset:
    """``len(ds)``, ``ds.in_features``, ``ds[i] -> (x_i, y_i)`` (1-D float64 CPU tensors); ``ds.fetched`` logs i."""

    def __init__(self, x, y):
        self.x, self.y = x, y
        self.in_features = x.shape[1]
        self.fetched = []

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, i):
        i = int(i)
        self.fetched.append(i)
        return self.x[i].clone(), self.y[i].clone()


def make_data(n, in_features, out_features, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, in_features, generator=gen, dtype=torch.float64, device="cpu"),
            torch.randn(n, out_features, generator=gen, dtype=torch.float64, device="cpu"))


def epoch_batches(n, global_batch, seed, step):
    """The global batch of step ``step`` (0-based): (epoch, the sample indices, in order)."""
    per_epoch = math.ceil(n / global_batch)
    epoch, j = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch), device="cpu").tolist()
    return epoch, order[j * global_batch:(j + 1) * global_batch]


def flat_state(opt, params):
    """Each per-element state of a torch optimizer over ``params``, flattened in order; plus the scalars."""
    keys = sorted({k for p in params for k, v in opt.state.get(p, {}).items()
                   if isinstance(v, torch.Tensor) and v.dim() > 0})
    flat = {k: torch.cat([opt.state[p][k].detach().reshape(-1) for p in params]) for k in keys}
    scalars = {k: float(v) for p in params[:1] for k, v in opt.state.get(p, {}).items()
               if not (isinstance(v, torch.Tensor) and v.dim() > 0)}
    return flat, scalars


def oracle(case, steps):
    """Uninterrupted single-process training: after each step, the flat parameters and the flat optimizer state."""
    model = random_mlp(case["widths"], case["init_seed"])
    params = list(model.parameters())
    x, y = make_data(case["n"], case["widths"][0], case["widths"][-1], case["data_seed"])
    opt = case["optimizer"].build(params)
    gen = torch.Generator().manual_seed(case["seed"])
    p_drop = case["dropout"]
    history = []
    for step in range(steps):
        _, batch = epoch_batches(case["n"], case["global_batch"], case["seed"], step)
        keep = torch.rand((len(batch), x.shape[1]), generator=gen, dtype=torch.float64, device="cpu") >= p_drop
        xb = x[batch] * keep / (1 - p_drop)
        opt.zero_grad(set_to_none=True)
        (((model(xb) - y[batch]) ** 2).sum() / len(batch)).backward()
        opt.step()
        flat, scalars = flat_state(opt, params)
        history.append({"params": torch.cat([p.detach().reshape(-1) for p in params]).clone(),
                        "state": {k: v.clone() for k, v in flat.items()}, "scalars": scalars})
    return history
