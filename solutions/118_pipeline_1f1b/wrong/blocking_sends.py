"""run_pipeline sends with blocking dist.send: two neighbours that both send first wait on each other forever."""
import torch
import torch.distributed as dist

import harness
from harness import reference_of

reference_of(__file__, into=globals())
REJECTED_BY = "test_no_deadlock"


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    stage, p = dist.get_rank(), dist.get_world_size()
    m = sum(1 for kind, _ in ops if kind == "F")
    dtype, where = next(stage_module.parameters()).dtype, harness.device()
    saved, total = {}, 0.0
    for kind, mb in ops:
        if kind == "F":
            if stage == 0:
                x = inputs[mb]
            else:
                x = torch.empty(act_shape, dtype=dtype, device=where)
                dist.recv(x, stage - 1)
                x.requires_grad_()
            out = stage_module(x)
            if stage == p - 1:
                out = loss_fn(out, targets[mb]) / m
                total += out.item()
            else:
                dist.send(out.detach().contiguous(), stage + 1)
            saved[mb] = (x, out)
        else:
            x, out = saved.pop(mb)
            if stage == p - 1:
                out.backward()
            else:
                grad = torch.empty(act_shape, dtype=dtype, device=where)
                dist.recv(grad, stage + 1)
                out.backward(grad)
            if stage > 0:
                dist.send(x.grad.contiguous(), stage - 1)
    return total if stage == p - 1 else None
