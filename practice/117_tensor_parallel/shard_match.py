"""Find which entries of the full tensors a rank holds, by value, whatever its layout or attribute names.

The test fills the full tensors with values that are all distinct
(``distinct_values_``), so any entry a rank keeps points back to exactly one
place in exactly one full tensor.  A rank function returns ``held_tensors(module)``;
the test process then checks that the rank holds exactly its shard, once, in
storage of its own, and that the gradients of what it holds are the matching
entries of the full gradients.  Fused, split, transposed or renamed parameters
all pass; a full copy, a wrong slice or a view into the full tensor do not.

What the module's attributes do not show (a full weight in a closure, a default
argument or a module-level dict) is found by ``kept_storages``: every tensor storage
left alive in the rank after the rank has dropped its own references to the full
layers, read by value like the rest.
"""
from __future__ import annotations

import torch

from harness import PropertyFailed, assert_close, check, live_storages


def distinct_values_(tensors, seed: int, scale: float = 1.0):
    """Fill ``tensors`` in place with values in (-scale, scale) that are distinct across all of them."""
    tensors = list(tensors)
    total = sum(t.numel() for t in tensors)
    gen = torch.Generator().manual_seed(seed)
    magnitude = (torch.randperm(total, generator=gen, dtype=torch.float64) + 1) / total * scale
    sign = torch.randint(0, 2, (total,), generator=gen, dtype=torch.float64) * 2 - 1
    values, offset = magnitude * sign, 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(values[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
    return tensors


def own_tensors(module):
    """(name, kind, tensor, grad) for every tensor ``module`` keeps: parameters with their grads, buffers, and
    tensor attributes (also one level inside a list, tuple or dict), each once."""
    seen = set()

    def once(name, kind, t, grad=None):
        if id(t) not in seen:
            seen.add(id(t))
            yield name, kind, t, grad

    for name, p in module.named_parameters():
        yield from once(name, "parameter", p, p.grad)
    for name, b in module.named_buffers():
        yield from once(name, "buffer", b)
    for prefix, sub in module.named_modules():
        for key, value in vars(sub).items():
            name = f"{prefix}.{key}" if prefix else key
            items = value.items() if isinstance(value, dict) else enumerate(value) \
                if isinstance(value, (list, tuple)) else [(None, value)]
            for k, v in items:
                if isinstance(v, torch.Tensor) and key not in ("_parameters", "_buffers"):
                    yield from once(name if k is None else f"{name}[{k!r}]", "attribute", v)


def held_tensors(module) -> list[dict]:
    """Rank side: every floating tensor ``module`` keeps (``own_tensors``), as plain data."""
    return [{"name": name, "kind": kind, "value": t.detach().cpu().clone(),
             "grad": None if grad is None else grad.detach().cpu().clone(),
             "bytes": t.numel() * t.element_size(), "storage_bytes": t.untyped_storage().nbytes()}
            for name, kind, t, grad in own_tensors(module) if t.is_floating_point()]


def storages_before(layers):
    """Rank side: every tensor storage alive now except the full layers' own, held so that no later storage
    takes one of their addresses (the full layers' storages must stay free to die)."""
    return live_storages(collect=False).without([p for layer in layers.values() for p in layer.parameters()])


def kept_storages(module, before, exclude, dtype) -> list[dict]:
    """Rank side: the values of every tensor storage alive now that was not ``before``, less ``exclude`` and
    less ``module``'s own tensors, wherever it is held (through gc: closures, default arguments, module-level
    objects...).  A storage that no floating tensor views (a bare storage, a byte view) is read as ``dtype``,
    the full layers' dtype."""
    own = [t for _, _, tensor, grad in own_tensors(module) for t in (tensor, grad) if t is not None]
    out = []
    for held in live_storages(exclude=[before, exclude, own]).values():
        as_dtype = getattr(torch, held.dtype.removeprefix("torch."), None) if held.dtype != "storage" else None
        if as_dtype is None or not as_dtype.is_floating_point:
            as_dtype = dtype
        if held.nbytes % as_dtype.itemsize:
            continue
        content = torch.empty(0, dtype=as_dtype, device=held.storage.device).set_(held.storage)
        out.append({"name": f"a storage of {held.describe()}", "kind": "storage", "value": content.cpu().clone(),
                    "grad": None})
    return out


class Holding:
    """Where each held entry sits in the full tensors (the test-process side of ``held_tensors``)."""

    def __init__(self, full: dict, held: list):
        self.full, self.held = full, held
        where = {}
        for name, t in full.items():
            for i, v in enumerate(t.detach().flatten().tolist()):
                where[v] = (name, i)
        self.count = {name: torch.zeros(t.numel(), dtype=torch.long) for name, t in full.items()}
        self.grad = {name: torch.full((t.numel(),), float("nan"), dtype=t.dtype) for name, t in full.items()}
        self.matches = []      # per held tensor: list of (full name, flat index) for its matched entries
        self.unmatched = {}    # held parameter name -> number of entries in no full tensor
        for h in held:
            found = [where.get(v) for v in h["value"].flatten().tolist()]
            self.matches.append([f for f in found if f is not None])
            missing = sum(f is None for f in found)
            if missing and h["kind"] == "parameter":
                self.unmatched[h["name"]] = missing
            for name, i in self.matches[-1]:
                self.count[name][i] += 1
            if h["kind"] == "parameter" and h["grad"] is not None:
                for (name, i), g in zip((f for f in found), h["grad"].flatten().tolist()):
                    if name is not None:
                        self.grad[name][i] = g

    def _holders(self, name: str, indices: set) -> str:
        names = [h["name"] for h, found in zip(self.held, self.matches)
                 if any(n == name and i in indices for n, i in found)]
        return ", ".join(f"'{n}'" for n in names) or "?"


def check_holds_exactly(full: dict, held: list, shards: dict, rank=None) -> Holding:
    """Every entry of every ``shards[name] = (flat index tensor, description)`` held exactly once, and nothing else."""
    holding = Holding(full, held)
    for name, count in holding.unmatched.items():
        check(False, f"parameter '{name}' holds {count} values that are in none of the full layers' tensors: "
                     "a parameter must be a copy of a slice of the full weights", rank=rank)
    for name, t in full.items():
        index, what = shards.get(name, (torch.zeros(0, dtype=torch.long), "nothing"))
        mine = torch.zeros(t.numel(), dtype=torch.bool)
        mine[index.flatten()] = True
        count = holding.count[name]
        lost = int((mine & (count == 0)).sum())
        check(lost == 0, f"{lost} of the {int(mine.sum())} entries of {name} this rank must hold ({what}) are in "
                         "none of its tensors", rank=rank)
        extra = set(torch.nonzero(~mine & (count > 0)).flatten().tolist())
        check(not extra, f"holds {_entries(len(extra))} of {name} outside its shard (its shard is {what}), in "
                         f"{holding._holders(name, extra)}: keep only the shard, not the full tensor", rank=rank)
        twice = set(torch.nonzero(count > 1).flatten().tolist())
        check(not twice, f"holds {_entries(len(twice))} of {name} ({what}) more than once, in "
                         f"{holding._holders(name, twice)}", rank=rank)
    return holding


def check_nothing_else_kept(full: dict, kept: list, shards: dict, rank=None):
    """No storage alive in the rank beyond its layer's own tensors holds an entry outside the rank's shard."""
    holding = Holding(full, kept)
    for name in full:
        index, what = shards.get(name, (torch.zeros(0, dtype=torch.long), "nothing"))
        mine = torch.zeros(full[name].numel(), dtype=torch.bool)
        mine[index.flatten()] = True
        extra = set(torch.nonzero(~mine & (holding.count[name] > 0)).flatten().tolist())
        check(not extra, f"keeps {_entries(len(extra))} of {name} outside its shard (its shard is {what}) in "
                         f"{holding._holders(name, extra)}, alive in the rank after the full layers were dropped "
                         "but in none of the layer's attributes (a closure, a default argument or a module-level "
                         "object holds it): keep only the shard, not the full tensor", rank=rank)


def check_shard_grads(full: dict, held: list, full_grads: dict, shards: dict, rank=None, atol=1e-9, rtol=1e-7):
    """The gradient of each entry of each shard, where the rank holds it, equals the full gradient there."""
    holding = Holding(full, held)
    for h in held:
        check(h["kind"] != "parameter" or h["grad"] is not None,
              f"parameter '{h['name']}' has no .grad after backward", rank=rank)
    for name, (index, what) in shards.items():
        lost = int((holding.count[name][index.flatten()] == 0).sum())
        check(lost == 0, f"{lost} entries of {name} this rank must hold ({what}) are in none of its parameters, "
                         "so their gradients cannot be compared", rank=rank)
        got = holding.grad[name][index]
        want = full_grads[name].flatten()[index]
        assert_close(got, want, f"gradient of {name} ({what})", rank=rank, atol=atol, rtol=rtol)


def check_own_storage(held: list, rank=None):
    """No parameter is a view into a bigger tensor (such as the full weight), which would keep it alive."""
    for h in held:
        if h["kind"] == "parameter" and h["storage_bytes"] > h["bytes"]:
            raise PropertyFailed(
                f"parameter '{h['name']}' (shape {list(h['value'].shape)}, {h['bytes']} bytes) is a view into a "
                f"storage of {h['storage_bytes']} bytes, so the full tensor stays in memory on every rank: "
                "store a .clone() of the slice" + (f" (rank {rank})" if rank is not None else ""))


def rows(shape, index) -> torch.Tensor:
    """Flat indices of ``index`` along dim 0 of a tensor of ``shape``, shaped like that slice."""
    return torch.arange(_numel(shape)).view(shape).index_select(0, torch.as_tensor(index))


def columns(shape, index) -> torch.Tensor:
    """Flat indices of ``index`` along dim 1, shaped like that slice."""
    return torch.arange(_numel(shape)).view(shape).index_select(1, torch.as_tensor(index))


def _entries(k: int) -> str:
    return f"{k} entr{'y' if k == 1 else 'ies'}"


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
