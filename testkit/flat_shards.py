"""The flat, padded partition of ZeRO / FSDP, and the costs that follow from it, for tests.

Everything here runs in the test process (or in a test's rank function): it
computes what a correct implementation must hold and send, from first
principles, so the tests never need numbers reported by the learner's code.

    P elements, N ranks:  S = ceil(P / N);  rank r owns [r*S, (r+1)*S) of the vector padded to N*S
"""
from __future__ import annotations

import gc
import math

import torch

def shard_size(numel: int, world_size: int) -> int:
    """S = ceil(P / N): the elements each rank owns, padding included."""
    return math.ceil(numel / world_size)


def owned_real(numel: int, world_size: int, rank: int) -> int:
    """How many of rank ``rank``'s S elements are real (not padding)."""
    s = shard_size(numel, world_size)
    return max(0, min(s, numel - rank * s))


def flat_padded(tensors, world_size: int) -> torch.Tensor:
    """The tensors flattened in order into one vector, zero-padded to N*S elements."""
    tensors = [t.detach().reshape(-1) for t in tensors]
    numel = sum(t.numel() for t in tensors)
    flat = torch.zeros(world_size * shard_size(numel, world_size), dtype=tensors[0].dtype, device=tensors[0].device)
    if numel:
        flat[:numel] = torch.cat(tensors)
    return flat


def owned_slice(tensors, world_size: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s S elements of the flat, padded vector."""
    flat = flat_padded(tensors, world_size)
    s = flat.numel() // world_size
    return flat[rank * s:(rank + 1) * s]


def unflatten(flat: torch.Tensor, shapes) -> list:
    """Split the first sum(numel) elements of ``flat`` back into tensors of ``shapes``."""
    out, offset = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[offset:offset + n].reshape(shape).clone())
        offset += n
    return out


def ring_wire_bytes(kind: str, in_bytes: int, world_size: int) -> float:
    """Bytes one rank puts on the wire for a ring collective whose input on that rank is ``in_bytes``.

    all_reduce of B bytes: 2(N-1)/N * B; reduce_scatter of a B-byte input: (N-1)/N * B;
    all_gather of a B-byte shard: (N-1) * B; anything else is counted as its input, once.
    """
    n = world_size
    factors = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": n - 1}
    return factors.get(kind, 1) * in_bytes


def states_per_element(optimizer) -> int:
    """Per-element state tensors (the scalar step counter aside) a torch optimizer keeps, from an ``OptimizerSpec``."""
    if optimizer.name == "SGD":
        return 1 if optimizer.kwargs.get("momentum", 0) else 0
    if optimizer.name in ("Adam", "AdamW"):
        return 3 if optimizer.kwargs.get("amsgrad") else 2
    raise ValueError(f"no per-element state count known for {optimizer.name}")


_OPAQUE = (type(gc), type, type(len), type(lambda: 0), type(print.__call__), type((lambda: 0).__code__))


def reachable_optimizers(root, limit: int = 200_000) -> list:
    """Every torch optimizer reachable from ``root`` through attributes, lists, dicts, ... (call it inside a rank).

    Modules, classes, functions and tensors are not entered, so the walk stays within
    the object's own data and does not wander into the rest of the process.
    """
    found, seen, todo = [], {id(root)}, [root]
    while todo and len(seen) < limit:
        obj = todo.pop()
        if isinstance(obj, torch.optim.Optimizer):
            found.append(obj)
            continue
        if isinstance(obj, (torch.Tensor, *_OPAQUE)):
            continue
        for ref in gc.get_referents(obj):
            if id(ref) not in seen:
                seen.add(id(ref))
                todo.append(ref)
    return found


def optimizer_state(optimizers) -> dict:
    """Measure the state tensors of the given torch optimizers.

    Returns {"optimizers": count, "element_bytes": bytes of state tensors with at least one
    dimension, "scalars": number of 0-d state tensors (step counters), "tensors": [(name, shape, dtype)]}.
    """
    element_bytes, scalars, tensors = 0, 0, []
    for opt in optimizers:
        for state in opt.state.values():
            for name, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                tensors.append((name, tuple(value.shape), str(value.dtype)))
                if value.dim() == 0:
                    scalars += 1
                else:
                    element_bytes += value.numel() * value.element_size()
    return {"optimizers": len(optimizers), "element_bytes": element_bytes, "scalars": scalars, "tensors": tensors}


def mlp_widths_with_tiny(max_layers: int = 3):
    """Hypothesis strategy: MLP widths of 1..max_layers layers, and often Linear(1, 1), whose P = 2 < N for N = 3, 4."""
    from hypothesis import strategies as st

    from .strategies import mlp_widths
    return st.one_of(mlp_widths(max_layers=max_layers), st.just([1, 1]))
