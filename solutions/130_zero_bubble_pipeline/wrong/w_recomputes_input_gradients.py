"""F keeps only the stage's input and output (no cut between layers).  B is torch.autograd.grad(out, x), and W
is torch.autograd.grad(out, parameters): it walks the stage's backward again, input gradients of every inner
layer included.  The values are right; the inner input gradients are computed twice."""
import torch
import torch.distributed as dist

import harness
from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_run_follows_the_op_list"


def run_zero_bubble(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    stage, p = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda k: dist.get_global_rank(group, k)) if group is not None else (lambda k: k)
    m = sum(kind == "F" for kind, _ in ops)
    dtype, where = next(stage_module.parameters()).dtype, harness.device()
    params = list(stage_module.parameters())
    kept, sends, total = {}, [], 0.0
    for kind, i in ops:
        if kind == "F":
            if stage == 0:
                x = inputs[i]
            else:
                x = torch.empty(act_shape, dtype=dtype, device=where)
                dist.recv(x, peer(stage - 1), group=group)
                x.requires_grad_()
            out = stage_module(x)
            if stage == p - 1:
                out = loss_fn(out, targets[i]) / m
                total += out.item()
            else:
                sends.append(dist.isend(out.detach().contiguous(), peer(stage + 1), group=group))
            kept[i] = [x, out, None]
        elif kind == "B":
            x, out, _ = kept[i]
            if stage < p - 1:
                grad = torch.empty(act_shape, dtype=dtype, device=where)
                dist.recv(grad, peer(stage + 1), group=group)
                kept[i][2] = grad
            if stage > 0:
                dx, = torch.autograd.grad(out, x, kept[i][2], retain_graph=True)
                sends.append(dist.isend(dx.contiguous(), peer(stage - 1), group=group))
        else:
            x, out, grad = kept.pop(i)
            for q, g in zip(params, torch.autograd.grad(out, params, grad)):
                q.grad = g if q.grad is None else q.grad + g
    for work in sends:
        work.wait()
    return total if stage == p - 1 else None
