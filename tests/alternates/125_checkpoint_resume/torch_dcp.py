"""torch.distributed.checkpoint does the writing and the reading: every rank dcp.save()s its entries (rank-tagged
keys: its shard and per-element optimizer state; rank 0 adds the generator and the scalars), then rank 0 commits
DCP's files with their checksums; resume builds its request from DCP's own metadata and dcp.load()s every old
rank's entries on any world size.  The training step is the reference's ZeRO-1, written as one function.

DCP's object collectives wait for a killed rank; the call still ends once the kill is seen
(tests/test_harness_faults.py, the object-collective kill)."""
import hashlib
import json
import math
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

MARKER = "COMMIT"


class CheckpointError(RuntimeError):
    pass


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Trainer:
    def __init__(self, model, dataset, global_batch, optimizer_cls, seed, dropout=0.0, **opt_kwargs):
        self.model, self.dataset, self.global_batch = model, dataset, global_batch
        self.seed, self.dropout = seed, dropout
        self.params = list(model.parameters())
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world)
        self.step = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.shard = self._cut(self._flat([p.detach() for p in self.params]), self.world, self.rank).clone()
        self.shard.requires_grad_(True)
        self.local_optimizer = optimizer_cls([self.shard], **opt_kwargs)

    def _flat(self, tensors):
        return torch.cat([t.reshape(-1) for t in tensors])

    def _cut(self, flat, world, rank):
        """Slice ``rank`` of ``flat`` (P elements) zero-padded to world * ceil(P / world)."""
        size = math.ceil(self.numel / world)
        padded = flat.new_zeros(world * size)
        padded[:self.numel] = flat[:self.numel]
        return padded[rank * size:(rank + 1) * size]

    def _load_params(self, flat):
        with torch.no_grad():
            for p, part in zip(self.params, flat[:self.numel].split([p.numel() for p in self.params])):
                p.copy_(part.view_as(p))

    def train_step(self):
        n = len(self.dataset)
        epoch, j = divmod(self.step, math.ceil(n / self.global_batch))
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + epoch), device="cpu").tolist()
        batch = order[j * self.global_batch:(j + 1) * self.global_batch]
        keep = torch.rand((len(batch), self.dataset.in_features), generator=self.generator, dtype=torch.float64,
                          device="cpu") >= self.dropout
        for p in self.params:
            p.grad = None
        mine = batch[self.rank::self.world]
        if mine:
            x, y = (torch.stack(t) for t in zip(*(self.dataset[i] for i in mine)))
            x = (x * keep[self.rank::self.world] / (1 - self.dropout)).to(self.shard)
            (((self.model(x) - y.to(self.shard)) ** 2).sum() / len(batch)).backward()
        grad = self._flat([torch.zeros_like(p) if p.grad is None else p.grad for p in self.params])
        grad = torch.cat([grad, grad.new_zeros(self.world * self.shard_size - self.numel)])
        dist.all_reduce(grad)
        self.shard.grad = grad[self.rank * self.shard_size:(self.rank + 1) * self.shard_size].clone()
        self.local_optimizer.step()
        full = torch.empty_like(grad)
        dist.all_gather_into_tensor(full, self.shard.detach())
        self._load_params(full)
        self.step += 1

    def _entries(self):
        """What this rank gives DCP: rank-tagged shard and per-element state; rank 0 also the shared values."""
        state = self.local_optimizer.state.get(self.shard, {})
        mine = {f"rank{self.rank}.shard": self.shard.detach().cpu()}
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                mine[f"rank{self.rank}.state.{key}"] = value.detach().cpu()
            elif self.rank == 0:
                mine[f"scalar.{key}"] = torch.as_tensor(value).cpu()
        if self.rank == 0:
            mine["generator"] = self.generator.get_state()
        return mine

    def save(self, directory, step):
        folder = os.path.join(directory, f"step_{step}")
        dcp.save(self._entries(), checkpoint_id=folder)          # returns once every rank's files are written
        if self.rank == 0:
            files = {name: _sha256(os.path.join(folder, name)) for name in sorted(os.listdir(folder))}
            with open(os.path.join(folder, MARKER + ".tmp"), "w") as f:
                json.dump({"step": step, "world_size": self.world, "files": files}, f)
            os.replace(os.path.join(folder, MARKER + ".tmp"), os.path.join(folder, MARKER))
        dist.barrier()

    def resume(self, directory):
        complete = [int(e[5:]) for e in os.listdir(directory)
                    if e.startswith("step_") and e[5:].isdigit() and os.path.isfile(os.path.join(directory, e, MARKER))]
        if not complete:
            raise CheckpointError(f"no complete checkpoint in {directory}")
        folder = os.path.join(directory, f"step_{max(complete)}")
        with open(os.path.join(folder, MARKER)) as f:
            meta = json.load(f)
        for name, digest in meta["files"].items():
            path = os.path.join(folder, name)
            if not os.path.isfile(path) or _sha256(path) != digest:
                raise CheckpointError(f"{path} is missing or damaged")
        stored = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
        wanted = {key: torch.empty(tuple(md.size), dtype=md.properties.dtype) for key, md in stored.items()}
        dcp.load(wanted, checkpoint_id=folder)
        old = meta["world_size"]
        flat = torch.cat([wanted[f"rank{r}.shard"] for r in range(old)]).to(self.shard)
        self._load_params(flat)
        with torch.no_grad():
            self.shard.copy_(self._cut(flat, self.world, self.rank))
        state = {key[len("scalar."):]: value for key, value in wanted.items() if key.startswith("scalar.")}
        for key in {k.split(".state.")[1] for k in wanted if ".state." in k}:
            whole = torch.cat([wanted[f"rank{r}.state.{key}"] for r in range(old)]).to(self.shard)
            state[key] = self._cut(whole, self.world, self.rank).clone()
        groups = self.local_optimizer.state_dict()["param_groups"]
        self.local_optimizer.load_state_dict({"state": {0: state} if state else {}, "param_groups": groups})
        self.generator.set_state(wanted["generator"])
        self.step = meta["step"]
        return self.step
