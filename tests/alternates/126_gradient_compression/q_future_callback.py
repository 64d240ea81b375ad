"""Asynchronous without a collective in a callback: the hook all-reduces P and waits, then returns the future of
the Q all-reduce, whose callback (no communication in it) writes P Q^T and the error; the first Q comes from a
state-wide generator drawn in float32; the bf16 hook sums in bfloat16 and divides by the world size afterwards, in
float32."""
import torch
import torch.distributed as dist


class BF16State:
    def __init__(self, process_group=None):
        self.process_group = process_group


def bf16_compress_hook(state, bucket):
    buffer = bucket.buffer()
    world = dist.get_world_size(state.process_group)
    work = dist.all_reduce(buffer.to(torch.bfloat16), group=state.process_group, async_op=True)

    def decompress(fut):
        buffer.copy_(fut.value()[0])
        return buffer.div_(world)
    return work.get_future().then(decompress)


class PowerSGDState:
    def __init__(self, process_group=None, matrix_approximation_rank=1, seed=0):
        if matrix_approximation_rank < 1:
            raise ValueError("matrix_approximation_rank must be at least 1")
        self.process_group, self.r = process_group, matrix_approximation_rank
        self.generator = torch.Generator().manual_seed(seed)
        self.memory = {}          # parameter -> [error, Q]


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflat(flat, likes):
    return [part.view_as(t) for t, part in zip(likes, flat.split([t.numel() for t in likes]))]


def powersgd_hook(state, bucket):
    group = state.process_group
    world = dist.get_world_size(group)
    pairs = list(zip(bucket.parameters(), bucket.gradients()))
    vectors = [g for _, g in pairs if g.dim() < 2]
    mats = [(p, g.view(g.shape[0], -1)) for p, g in pairs if g.dim() >= 2]
    if vectors:
        flat = _flat(vectors)
        dist.all_reduce(flat, group=group)
        for g, part in zip(vectors, _unflat(flat / world, vectors)):
            g.copy_(part)
    if not mats:
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    for p, M in mats:
        if p not in state.memory:
            r = min(M.shape[0], M.shape[1], state.r)
            q = torch.randn(M.shape[1], r, generator=state.generator, dtype=torch.float32)
            state.memory[p] = [torch.zeros_like(M), q.to(M)]
    inputs = [M + state.memory[p][0] for p, M in mats]
    Ps = [M_in @ state.memory[p][1] for (p, _), M_in in zip(mats, inputs)]
    flat_p = _flat(Ps)
    dist.all_reduce(flat_p, group=group)
    Ps = [torch.linalg.qr(P).Q for P in _unflat(flat_p, Ps)]
    Qs = [M_in.T @ P for M_in, P in zip(inputs, Ps)]
    flat_q = _flat(Qs)
    work = dist.all_reduce(flat_q, group=group, async_op=True)

    def decompress(fut):
        for (p, M), M_in, P, Q in zip(mats, inputs, Ps, _unflat(fut.value()[0] / world, Qs)):
            M.copy_(P @ Q.T)
            state.memory[p] = [M_in - M, Q]
        return bucket.buffer()
    return work.get_future().then(decompress)
