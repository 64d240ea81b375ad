"""The training workload every model problem runs: a small MLP on random data, Adam, seeded.

Every rank builds the same model (one seed), and each step gives each rank its own batch (the
seed, the step and the rank), so yours and torch's train on exactly the same numbers.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

WIDTHS = (256, 1024, 1024, 256)   # about 1.6 M parameters: 6 MiB of float32, of gradients, twice that of Adam state
LOCAL_BATCH = 32                  # rows per rank per step
LR = 1e-3
SEED = 0


def make_model(device) -> nn.Sequential:
    """Linear, Tanh, Linear, Tanh, Linear: each Linear is one unit for the sharded problems."""
    torch.manual_seed(SEED)
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(WIDTHS) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers).to(device)


def batch(step: int, device) -> tuple:
    """This rank's (x, y) for ``step``."""
    g = torch.Generator().manual_seed(SEED + 1 + step * dist.get_world_size() + dist.get_rank())
    x = torch.randn(LOCAL_BATCH, WIDTHS[0], generator=g)
    y = torch.randn(LOCAL_BATCH, WIDTHS[-1], generator=g)
    return x.to(device), y.to(device)


def loss_fn(out, y):
    return nn.functional.mse_loss(out, y)


def adam(params):
    return torch.optim.Adam(params, lr=LR)


def warm_up(device):
    """One training step, before any contender: what a process sets up on its first backward, optimizer step
    (it imports torch._dynamo: 2 s, 80 MiB), broadcast and all_reduce (threads, the matrix library's and
    the backend's buffers) is then nobody's time or memory."""
    model = make_model(device)
    for p in model.parameters():
        dist.broadcast(p.detach(), src=0)
    opt = adam(model.parameters())
    x, y = batch(0, device)
    loss_fn(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, async_op=True).wait()
    opt.step()


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def describe() -> str:
    count = sum(a * b + b for a, b in zip(WIDTHS, WIDTHS[1:]))
    return (f"MLP {'-'.join(map(str, WIDTHS))} ({count} parameters, float32), "
            f"{LOCAL_BATCH} rows per rank per step, Adam")
