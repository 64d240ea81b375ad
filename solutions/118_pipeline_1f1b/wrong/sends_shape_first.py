"""Every tensor is preceded by a message carrying its shape, as runtimes that infer shapes do: right values, twice
the messages and more bytes than act_shape, which both sides know already, needs."""
import torch
import torch.distributed as dist

import harness
from harness import reference_of

ref = reference_of(__file__, into=globals())
REJECTED_BY = "test_p2p_goes_to_neighbours_only"


def _send_with_shape(tensor, peer, group):
    shape = torch.tensor(tensor.shape, dtype=torch.int64, device=tensor.device)
    return [ref._isend(shape, peer, group), ref._isend(tensor, peer, group)]


def _recv_with_shape(peer, dims, dtype, where, group):
    shape = torch.empty(dims, dtype=torch.int64, device=where)
    dist.irecv(shape, peer, group=group).wait()
    tensor = torch.empty(shape.tolist(), dtype=dtype, device=where)
    dist.irecv(tensor, peer, group=group).wait()
    return tensor


def run_pipeline(stage_module, ops, act_shape, inputs=None, targets=None, loss_fn=None, group=None):
    stage, p = dist.get_rank(group), dist.get_world_size(group)
    prev = dist.get_global_rank(group, stage - 1) if group is not None and stage > 0 else stage - 1
    nxt = dist.get_global_rank(group, stage + 1) if group is not None and stage < p - 1 else stage + 1
    first, last = stage == 0, stage == p - 1
    m = sum(1 for kind, _ in ops if kind == "F")
    dtype, where = next(stage_module.parameters()).dtype, harness.device()
    saved, sends, total = {}, [], 0.0
    for kind, mb in ops:
        if kind == "F":
            if first:
                x = inputs[mb]
            else:
                x = _recv_with_shape(prev, len(act_shape), dtype, where, group).requires_grad_()
            out = stage_module(x)
            if last:
                out = loss_fn(out, targets[mb]) / m
                total += out.item()
            else:
                sends += _send_with_shape(out.detach(), nxt, group)
            saved[mb] = (x, out)
        else:
            x, out = saved.pop(mb)
            if last:
                out.backward()
            else:
                out.backward(_recv_with_shape(nxt, len(act_shape), dtype, where, group))
            if not first:
                sends += _send_with_shape(x.grad, prev, group)
    for _, work in sends:
        work.wait()
    return total if last else None
