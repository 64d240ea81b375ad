"""Small composable hypothesis strategies shared by the problems.

They lean towards the cases that expose classic bugs: odd world sizes, sizes
not divisible by the world size, sizes smaller than it, and zero.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st

FLOAT_DTYPES = (torch.float32, torch.float64)


def world_sizes(min_size: int = 1, max_size: int = 4):
    """1..4 ranks, with 3 (odd: ring neighbours and remainders matter) drawn as often as the others."""
    return st.integers(min_size, max_size)


def seeds():
    return st.integers(0, 2**31 - 1)


def dtypes(*choices):
    return st.sampled_from(choices or FLOAT_DTYPES)


def numels(world_size: int, max_numel: int = 64):
    """Element counts that include 0, fewer than the world size, and non-multiples of it."""
    return st.one_of(
        st.integers(0, max(world_size - 1, 0)),
        st.integers(0, max_numel).filter(lambda n: n % max(world_size, 1) != 0),
        st.integers(0, max_numel),
    )


def shapes(numel: int | None = None, max_dims: int = 3, max_side: int = 6):
    """Tensor shapes, 0-d included.  With ``numel`` the product is fixed to it."""
    if numel is None:
        return st.lists(st.integers(0, max_side), min_size=0, max_size=max_dims).map(tuple)
    return st.sampled_from(_factorisations(numel, max_dims))


def _factorisations(n: int, max_dims: int) -> list:
    out = {(n,)}
    if n == 1:
        out.add(())
    for a in range(1, n + 1):
        if n % a == 0 and max_dims >= 2:
            out.add((a, n // a))
            b = n // a
            for c in range(1, b + 1):
                if b % c == 0 and max_dims >= 3:
                    out.add((a, c, b // c))
    return sorted(out)


def mlp_widths(min_layers: int = 1, max_layers: int = 4, max_width: int = 6):
    """Layer widths [in, h1, ..., out] for ``testkit.models.random_mlp``."""
    return st.lists(st.integers(1, max_width), min_size=min_layers + 1, max_size=max_layers + 1)


def optimizers():
    """An ``OptimizerSpec``: SGD (with and without momentum), Adam or AdamW, with drawn hyper-parameters."""
    from .models import OptimizerSpec
    lr = st.sampled_from([0.01, 0.05, 0.1])
    return st.one_of(
        st.builds(lambda lr: OptimizerSpec("SGD", {"lr": lr}), lr),
        st.builds(lambda lr, m: OptimizerSpec("SGD", {"lr": lr, "momentum": m}), lr, st.sampled_from([0.5, 0.9])),
        st.builds(lambda lr: OptimizerSpec("Adam", {"lr": lr}), lr),
        st.builds(lambda lr, wd: OptimizerSpec("AdamW", {"lr": lr, "weight_decay": wd}), lr,
                  st.sampled_from([0.0, 0.01])),
    )


def fewer_examples(fraction: float, minimum: int = 3):
    """``settings`` for a heavy multi-rank property: a fraction of the active profile's examples.

    Keeps the profiles meaningful (quick < default < thorough) while a 4-rank
    training run costs far more than a pure-function check.
    """
    from hypothesis import settings
    return settings(max_examples=max(minimum, int(settings.default.max_examples * fraction)))
