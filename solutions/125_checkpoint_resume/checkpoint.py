"""Problem 125 reference: ZeRO-1 data parallel training that checkpoints, and resumes on another world size."""
from __future__ import annotations

import hashlib
import json
import math
import os

import torch
import torch.distributed as dist

MARKER = "COMMIT"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be trusted: no complete one, or a file missing or not as saved."""


class Trainer:
    def __init__(self, model, dataset, global_batch, optimizer_cls, seed, dropout=0.0, **opt_kwargs):
        self.model, self.dataset, self.global_batch = model, dataset, global_batch
        self.seed, self.dropout = seed, dropout
        self.params = list(model.parameters())
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world)
        self.step = 0
        self.generator = torch.Generator().manual_seed(seed)      # one stream, the same on every rank
        own = self._flat([p.detach() for p in self.params])[self._own]
        self.shard = own.clone().requires_grad_(True)
        self.local_optimizer = optimizer_cls([self.shard], **opt_kwargs)

    # ---- ZeRO-1: the flat partition ----

    @property
    def _own(self):
        return slice(self.rank * self.shard_size, (self.rank + 1) * self.shard_size)

    def _flat(self, tensors):
        """The tensors flattened in order, zero-padded to N*S elements."""
        flat = torch.zeros(self.world * self.shard_size, dtype=self.params[0].dtype, device=self.params[0].device)
        if self.numel:
            flat[:self.numel] = torch.cat([t.reshape(-1) for t in tensors])
        return flat

    def _write_params(self, flat):
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    # ---- the data: a seeded order per epoch, consecutive global batches, rank r takes [r::N] ----

    def _position(self):
        """(epoch, batch within the epoch) of the next step: an epoch is ceil(n / B) batches, the last partial."""
        return divmod(self.step, math.ceil(len(self.dataset) / self.global_batch))

    def _batch(self):
        epoch, j = self._position()
        gen = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(len(self.dataset), generator=gen, device="cpu").tolist()
        return order[j * self.global_batch:(j + 1) * self.global_batch]

    def train_step(self):
        grad = self._flat(self._local_gradients())
        dist.all_reduce(grad)                                       # the sum of the parts: the batch mean
        with torch.no_grad():
            self.shard.grad = grad[self._own].clone()
            self.local_optimizer.step()
            full = torch.empty_like(grad)
            dist.all_gather_into_tensor(full, self.shard.detach())
            self._write_params(full)
        self.step += 1

    def _local_gradients(self) -> list:
        """This rank's part of the next batch's mean gradient, a tensor per parameter (zeros on a rank with no
        sample of it)."""
        batch = self._batch()
        b = len(batch)
        # the whole batch's mask on every rank (ranks without samples too), so the stream is one for all
        keep = torch.rand((b, self.dataset.in_features), generator=self.generator, dtype=torch.float64,
                          device="cpu") >= self.dropout
        mine, keep = batch[self.rank::self.world], keep[self.rank::self.world]
        for p in self.params:
            p.grad = None
        if mine:
            xs, ys = zip(*(self.dataset[i] for i in mine))
            here, dtype = self.params[0].device, self.params[0].dtype
            x = (torch.stack(xs) * keep / (1 - self.dropout)).to(here, dtype)
            y = torch.stack(ys).to(here, dtype)
            (((self.model(x) - y) ** 2).sum() / b).backward()     # this rank's part of the batch mean
        return [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]

    # ---- save: every rank its part (write, rename), a barrier, then one rank commits ----

    def save(self, directory, step):
        self._write_and_commit(os.path.join(directory, f"step_{step}"), step)
        dist.barrier()                                   # save returns once the checkpoint is committed

    def _write_and_commit(self, folder, step):
        os.makedirs(folder, exist_ok=True)
        self._write_part(os.path.join(folder, f"rank_{self.rank}.pt"), self._part())
        dist.barrier()                                   # every part is in place under its final name
        if self.rank == 0:
            self._commit(folder, step)

    def _part(self):
        """This rank's part: its shard, its optimizer state, and the generator (the same on every rank)."""
        return {"shard": self.shard.detach().cpu(), "optimizer": _to_cpu(self.local_optimizer.state_dict()),
                "rng": self.generator.get_state()}

    @staticmethod
    def _write_part(path, part):
        torch.save(part, path + ".tmp")
        os.replace(path + ".tmp", path)                  # a file under its final name is always whole

    def _commit(self, folder, step):
        """COMMIT lists every part with its sha256; it appears whole (rename) and last."""
        files = {f"rank_{r}.pt": _sha256(os.path.join(folder, f"rank_{r}.pt")) for r in range(self.world)}
        meta = {"step": step, "world_size": self.world, "numel": self.numel, "files": files}
        with open(os.path.join(folder, MARKER + ".tmp"), "w") as f:
            json.dump(meta, f)
        os.replace(os.path.join(folder, MARKER + ".tmp"), os.path.join(folder, MARKER))

    # ---- resume: the newest complete checkpoint, verified, re-sharded for this world ----

    def resume(self, directory):
        folder, meta = self._newest_complete(directory)
        parts = [self._load_part(folder, name, digest) for name, digest in meta["files"].items()]
        if meta["numel"] != self.numel:
            raise CheckpointError(f"{folder} holds {meta['numel']} parameter elements, this model has {self.numel}")
        # the saved shards, in rank order, are the flat vector: cut it again for this world
        flat = self._flat([torch.cat([p["shard"] for p in parts])[:self.numel].to(self.shard.device)])
        self._write_params(flat)
        with torch.no_grad():
            self.shard.copy_(flat[self._own])
        self._load_optimizer(parts)
        self.generator.set_state(parts[0]["rng"])
        self.step = meta["step"]                         # the data position follows from the step
        return self.step

    def _newest_complete(self, directory):
        steps = [int(e[5:]) for e in os.listdir(directory)
                 if e.startswith("step_") and e[5:].isdigit() and os.path.isfile(os.path.join(directory, e, MARKER))]
        if not steps:
            raise CheckpointError(f"no complete checkpoint in {directory} (no step_<k>/{MARKER})")
        folder = os.path.join(directory, f"step_{max(steps)}")      # the largest step, as a number
        with open(os.path.join(folder, MARKER)) as f:
            return folder, json.load(f)

    @staticmethod
    def _load_part(folder, name, digest):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"checkpoint file {path} is missing")
        if _sha256(path) != digest:
            raise CheckpointError(f"checkpoint file {path} is corrupt: its sha256 is not the one in {MARKER}")
        return torch.load(path, map_location="cpu")

    def _load_optimizer(self, parts):
        """Per-element states are re-sharded like the parameters; scalars (Adam's step) are the same everywhere."""
        state = {}
        for key, value in parts[0]["optimizer"]["state"].get(0, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                whole = torch.cat([p["optimizer"]["state"][0][key] for p in parts])[:self.numel]
                value = self._flat([whole.to(self.shard.device)])[self._own].clone()
            state[key] = value
        self.local_optimizer.load_state_dict({"state": {0: state} if state else {},
                                              "param_groups": parts[0]["optimizer"]["param_groups"]})


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value
