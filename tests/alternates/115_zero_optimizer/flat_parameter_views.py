"""DeepSpeed-style flat parameters: every parameter becomes a view of one zero-padded flat buffer of N*S
elements, and the all-gather writes the updated shards straight into that buffer.

So nothing is copied back after the gather, and the parameters' storage is the padded buffer itself: its
padding (N*S - P elements) belongs to the parameters, not to the optimizer.  The gradients are flattened into
a fresh padded vector each step; the master shard is a copy of this rank's slice, in the master dtype.
"""
import math

import torch
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, stage=2, group=None, master_dtype=None, **opt_kwargs):
        self.params = list(params)
        if stage not in (1, 2):
            raise ValueError(f"ShardedOptimizer implements stage 1 and 2, not stage {stage}")
        for what, values in (("dtype", {p.dtype for p in self.params}), ("device", {p.device for p in self.params})):
            if len(values) != 1:
                raise ValueError(f"every parameter needs the same {what}; got {sorted(map(str, values))}")
        self.stage, self.group = stage, group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.sizes = [p.numel() for p in self.params]
        self.s = math.ceil(sum(self.sizes) / self.n)
        self.flat = self._padded([p.detach() for p in self.params])
        with torch.no_grad():
            for p, view in zip(self.params, self._views(self.flat)):
                p.data = view
        own = self.flat[self.rank * self.s:(self.rank + 1) * self.s]
        self.shard = own.to(master_dtype or self.flat.dtype, copy=True).requires_grad_(True)
        self.local_optimizer = optimizer_cls([self.shard], **opt_kwargs)

    def _padded(self, tensors):
        flat = self.params[0].new_zeros(self.n * self.s)
        torch.cat([t.reshape(-1) for t in tensors], out=flat[:sum(self.sizes)])
        return flat

    def _views(self, flat):
        return [piece.view_as(p) for p, piece in zip(self.params, flat[:sum(self.sizes)].split(self.sizes))]

    def zero_grad(self, set_to_none=True):
        for p in self.params + [self.shard]:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

    @torch.no_grad()
    def step(self):
        grads = self._padded([torch.zeros_like(p) if p.grad is None else p.grad for p in self.params])
        if self.stage == 1:
            dist.all_reduce(grads, group=self.group)
            mine = grads[self.rank * self.s:(self.rank + 1) * self.s].clone()
        else:
            mine = grads.new_empty(self.s)
            dist.reduce_scatter_tensor(mine, grads, group=self.group)
            for p in self.params:
                p.grad = None
        del grads
        self.shard.grad = (mine / self.n).to(self.shard.dtype)
        self.local_optimizer.step()
        dist.all_gather_into_tensor(self.flat, self.shard.detach().to(self.flat.dtype), group=self.group)

    def state_dict(self):
        return {"shard": self.shard.detach().clone(), "optimizer": self.local_optimizer.state_dict()}

    def load_state_dict(self, sd):
        with torch.no_grad():
            self.shard.copy_(sd["shard"])
        self.local_optimizer.load_state_dict(sd["optimizer"])
