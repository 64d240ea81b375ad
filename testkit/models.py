"""Models, data and the single-process reference training loop, shared by the problems.

Everything here is deterministic from a seed, so the test process and every
rank can build the same model and data without sending them around.  They are drawn on
the CPU (one generator, the same numbers everywhere) and handed over on ``harness.device()``:
the rank's GPU under NCCL, the CPU in the test process and under gloo.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

import harness


@dataclass(frozen=True)
class OptimizerSpec:
    """A picklable recipe for a torch optimizer: ``OptimizerSpec("Adam", {"lr": 0.1}).build(params)``."""

    name: str
    kwargs: dict = field(default_factory=dict)

    def build(self, params):
        return getattr(torch.optim, self.name)(params, **self.kwargs)

    @property
    def cls(self):
        return getattr(torch.optim, self.name)

    def __str__(self):
        args = ", ".join(f"{k}={v}" for k, v in self.kwargs.items())
        return f"{self.name}({args})"


def random_mlp(widths, seed: int, dtype=torch.float64, frozen=()) -> nn.Sequential:
    """Linear layers of the given widths with Tanh between them, initialised from ``seed``.

    ``frozen`` lists parameter indices (in ``parameters()`` order) to set requires_grad=False.
    """
    gen = torch.Generator().manual_seed(seed)
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        linear = nn.Linear(fan_in, fan_out, dtype=dtype, device="cpu")
        with torch.no_grad():
            linear.weight.copy_(torch.randn(fan_out, fan_in, generator=gen, dtype=dtype, device="cpu") / fan_in ** 0.5)
            linear.bias.copy_(torch.randn(fan_out, generator=gen, dtype=dtype, device="cpu") * 0.1)
        layers.append(linear)
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    model = nn.Sequential(*layers).to(harness.device())
    for i, p in enumerate(model.parameters()):
        if i in frozen:
            p.requires_grad_(False)
    return model


def random_batches(steps: int, batch: int, in_dim: int, out_dim: int, seed: int, dtype=torch.float64):
    """``steps`` (x, y) pairs of full (global) batches for regression."""
    gen = torch.Generator().manual_seed(seed)
    where = harness.device()
    return [(torch.randn(batch, in_dim, generator=gen, dtype=dtype, device="cpu").to(where),
             torch.randn(batch, out_dim, generator=gen, dtype=dtype, device="cpu").to(where)) for _ in range(steps)]


def shard(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous slice of a global batch (dim 0)."""
    return x.tensor_split(world_size)[rank]


def mse(out, y):
    return nn.functional.mse_loss(out, y)


def train_reference(model: nn.Module, batches, optimizer: OptimizerSpec, loss_fn=mse) -> list:
    """Single-process training on full batches: the ground truth for data parallelism.

    Returns the parameters after each step, as a list (per step) of lists of tensors.
    """
    opt = optimizer.build([p for p in model.parameters() if p.requires_grad])
    history = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return history


def grad_bytes(model: nn.Module) -> list:
    """Gradient bytes of each parameter that requires grad, in definition order."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
