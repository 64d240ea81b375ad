"""A consolidated checkpoint: the ranks all-gather their shards and optimizer state, rank 0 alone writes the
whole run as one file, checkpoint.pt, and COMMIT is sha256sum-style text ("<digest>  <name>" lines, then the
step); ZeRO-1 sums the gradients with reduce_scatter instead of all_reduce."""
import hashlib
import math
import os

import torch
import torch.distributed as dist

WHOLE, MARKER = "checkpoint.pt", "COMMIT"


class CheckpointError(RuntimeError):
    pass


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _replace_atomically(path, write):
    write(path + ".tmp")
    os.replace(path + ".tmp", path)


def _write_text(text):
    def write(path):
        with open(path, "w") as f:
            f.write(text)
    return write


class Trainer:
    def __init__(self, model, dataset, global_batch, optimizer_cls, seed, dropout=0.0, **opt_kwargs):
        self.model, self.data, self.batch_size, self.seed, self.p = model, dataset, global_batch, seed, dropout
        self.params = list(model.parameters())
        self.n, self.r = dist.get_world_size(), dist.get_rank()
        self.numel = sum(q.numel() for q in self.params)
        self.size = math.ceil(self.numel / self.n)
        self.step = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.shard = self._padded(torch.cat([q.detach().reshape(-1) for q in self.params]))[self._mine()].clone()
        self.shard.requires_grad_(True)
        self.local_optimizer = optimizer_cls([self.shard], **opt_kwargs)

    def _mine(self):
        return slice(self.r * self.size, (self.r + 1) * self.size)

    def _padded(self, flat):
        out = flat.new_zeros(self.n * self.size)
        out[:flat.numel()] = flat
        return out

    def _set_params(self, flat):
        with torch.no_grad():
            for q, part in zip(self.params, flat[:self.numel].split([q.numel() for q in self.params])):
                q.copy_(part.view_as(q))

    def train_step(self):
        n_samples = len(self.data)
        epoch, j = divmod(self.step, -(-n_samples // self.batch_size))
        order = torch.randperm(n_samples, generator=torch.Generator().manual_seed(self.seed + epoch), device="cpu")
        batch = order[j * self.batch_size:(j + 1) * self.batch_size].tolist()
        mask = torch.rand((len(batch), self.data.in_features), generator=self.generator, dtype=torch.float64,
                          device="cpu") >= self.p
        like = self.params[0]
        grads = [torch.zeros_like(q) for q in self.params]
        mine = batch[self.r::self.n]
        if mine:
            rows = [self.data[i] for i in mine]
            x = torch.stack([a for a, _ in rows]) * mask[self.r::self.n] / (1 - self.p)
            y = torch.stack([b for _, b in rows])
            loss = ((self.model(x.to(like)) - y.to(like)) ** 2).sum() / len(batch)
            grads = torch.autograd.grad(loss, self.params)
        flat = self._padded(torch.cat([g.reshape(-1) for g in grads]))
        summed = torch.empty(self.size, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_tensor(summed, flat)
        self.shard.grad = summed
        self.local_optimizer.step()
        gathered = torch.empty(self.n * self.size, dtype=flat.dtype, device=flat.device)
        dist.all_gather_into_tensor(gathered, self.shard.detach())
        self._set_params(gathered)
        self.step += 1

    def _gathered(self, t):
        out = torch.empty(self.n * self.size, dtype=t.dtype, device=t.device)
        dist.all_gather_into_tensor(out, t.detach().contiguous())
        return out[:self.numel].cpu()

    def save(self, directory, step):
        state = self.local_optimizer.state.get(self.shard, {})
        whole = {"params": self._gathered(self.shard), "rng": self.generator.get_state(), "elementwise": {},
                 "scalars": {}}
        for key in sorted(state):
            value = state[key]
            if torch.is_tensor(value) and value.dim() > 0:
                whole["elementwise"][key] = self._gathered(value)
            else:
                whole["scalars"][key] = value
        if self.r == 0:
            folder = os.path.join(directory, f"step_{step}")
            os.makedirs(folder, exist_ok=True)
            _replace_atomically(os.path.join(folder, WHOLE), lambda p: torch.save(whole, p))
            lines = f"{_digest(os.path.join(folder, WHOLE))}  {WHOLE}\nstep {step}\n"
            _replace_atomically(os.path.join(folder, MARKER), _write_text(lines))
        dist.barrier()

    def resume(self, directory):
        steps = [int(e[5:]) for e in os.listdir(directory) if e.startswith("step_") and e[5:].isdigit()
                 and os.path.exists(os.path.join(directory, e, MARKER))]
        if not steps:
            raise CheckpointError(f"{directory} holds no complete checkpoint")
        folder = os.path.join(directory, f"step_{max(steps)}")
        with open(os.path.join(folder, MARKER)) as f:
            lines = f.read().splitlines()
        for line in lines[:-1]:
            digest, name = line.split("  ", 1)
            path = os.path.join(folder, name)
            if not os.path.exists(path) or _digest(path) != digest:
                raise CheckpointError(f"{path} is missing or not what was saved")
        whole = torch.load(os.path.join(folder, WHOLE), map_location="cpu")
        like = self.shard
        self._set_params(whole["params"].to(like))
        with torch.no_grad():
            self.shard.copy_(self._padded(whole["params"].to(like))[self._mine()])
        state = {key: self._padded(v.to(like))[self._mine()].clone() for key, v in whole["elementwise"].items()}
        state.update(whole["scalars"])
        saved = self.local_optimizer.state_dict()
        self.local_optimizer.load_state_dict({"state": {0: state} if state else {},
                                              "param_groups": saved["param_groups"]})
        self.generator.set_state(whole["rng"])
        self.step = int(lines[-1].split()[1])
        return self.step
