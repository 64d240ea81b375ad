"""Alternate: the ring the other way, built from batch_isend_irecv; x re-gathered in backward.

Every message goes to the PREVIOUS rank (so after s hops rank r holds chunk r + s), each hop is one
``dist.batch_isend_irecv`` of a send and a receive, the output is a ``torch.cat`` of the chunks' products
(``F.linear``), and all_gather_matmul saves only its own x: backward passes x round the ring again, folding
each chunk into w.grad while the next one travels (memory of one chunk, not the whole sequence).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def _seats(group):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    glob = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    return rank, size, glob((rank - 1) % size), glob((rank + 1) % size)   # send to, receive from


def _hop(tensor, to, frm, group):
    arriving = torch.empty_like(tensor)
    ops = [dist.P2POp(dist.isend, tensor, to, group), dist.P2POp(dist.irecv, arriving, frm, group)]
    return arriving, dist.batch_isend_irecv(ops)


def _done(works):
    for work in works:
        work.wait()


def _gather_mm(x, w, group, each=None):
    """cat over the ring of x_j @ w (in chunk order); ``each(j, chunk)`` sees every chunk as it passes."""
    rank, size, to, frm = _seats(group)
    held, products = x.contiguous(), [None] * size
    for step in range(size):
        if step < size - 1:
            arriving, works = _hop(held, to, frm, group)
        j = (rank + step) % size
        products[j] = F.linear(held, w.t())
        if each is not None:
            each(j, held)
        if step < size - 1:
            _done(works)
            held = arriving
    return torch.cat(products)


def _mm_scatter(x, w, group):
    rank, size, to, frm = _seats(group)
    if x.shape[0] % size:
        raise ValueError(f"sequence length {x.shape[0]} is not a multiple of the group size {size}")
    c, pending = x.shape[0] // size, None
    for step in range(size):
        j = (rank + step + 1) % size      # its partial sum travels towards rank j, one hop back per step
        partial = F.linear(x[j * c:(j + 1) * c], w.t())
        if pending is not None:
            arriving, works = pending
            _done(works)
            partial = arriving + partial
        if step < size - 1:
            pending = _hop(partial, to, frm, group)
    return partial


def _flat(t):
    return t.reshape(-1, t.shape[-1])


class _AG(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, group):
        ctx.save_for_backward(x, w)
        ctx.group = group
        return _gather_mm(x, w, group)

    @staticmethod
    def backward(ctx, dout):
        x, w = ctx.saved_tensors
        dout = dout.contiguous()
        dx = _mm_scatter(dout, w.t(), ctx.group)
        c, dw = x.shape[0], torch.zeros_like(w)

        def fold(j, chunk):
            dw.add_(_flat(chunk).t() @ _flat(dout[j * c:(j + 1) * c]))
        _gather_mm(x, w[:, :0], ctx.group, each=fold)   # x once more round the ring; w[:, :0]: no product
        return dx, dw, None


class _RS(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, group):
        ctx.save_for_backward(x, w)
        ctx.group = group
        return _mm_scatter(x, w, group)

    @staticmethod
    def backward(ctx, dout):
        x, w = ctx.saved_tensors
        dout = dout.contiguous()
        chunks = {}
        dx = _gather_mm(dout, w.t(), ctx.group, each=lambda j, chunk: chunks.__setitem__(j, chunk))
        gathered = torch.cat([chunks[j] for j in sorted(chunks)])
        return dx, _flat(x).t() @ _flat(gathered), None


def all_gather_matmul(x, w, group=None):
    return _AG.apply(x, w, group)


def matmul_reduce_scatter(x, w, group=None):
    return _RS.apply(x, w, group)
