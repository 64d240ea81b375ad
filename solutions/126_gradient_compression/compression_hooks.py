"""Problem 126 reference: gradient compression as DDP communication hooks (bf16 and PowerSGD)."""
import torch
import torch.distributed as dist


def _all_reduce_future(tensor, group) -> torch.futures.Future[torch.Tensor]:
    return dist.all_reduce(tensor, group=group, async_op=True).get_future()


class BF16State:
    """What bf16_compress_hook needs: the process group (None: the default group)."""

    def __init__(self, process_group=None):
        self.process_group = process_group


def bf16_compress_hook(state: BF16State, bucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in bfloat16: half the bytes of float32 on the wire."""
    buffer = bucket.buffer()
    world = dist.get_world_size(state.process_group)
    compressed = buffer.to(torch.bfloat16).div_(world)     # rounds each value, then the division, to bf16
    # decompress in place: the fp32 bucket takes the bf16 average
    return _all_reduce_future(compressed, state.process_group).then(lambda fut: buffer.copy_(fut.value()[0]))


class PowerSGDState:
    """PowerSGD's state: group, rank r, a seeded generator, and per parameter its error buffer and Q."""

    def __init__(self, process_group=None, matrix_approximation_rank: int = 1, seed: int = 0):
        if matrix_approximation_rank < 1:
            raise ValueError(f"matrix_approximation_rank must be >= 1, got {matrix_approximation_rank}")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.seed = seed
        self.generator = torch.Generator(device="cpu").manual_seed(seed)   # the same draws on every rank
        self.error = {}   # parameter -> this rank's error-feedback buffer, n x m
        self.q = {}       # parameter -> Q, m x r', the previous step's (warm start)

    def _feed_back(self, p, M):
        """M += this rank's error; on first sight, a zero error and a random Q.  Returns M's value to compress."""
        if p not in self.error:
            n, m = M.shape
            r = min(n, m, self.matrix_approximation_rank)
            self.error[p] = torch.zeros_like(M)
            self.q[p] = torch.randn(m, r, generator=self.generator, dtype=M.dtype, device="cpu").to(M.device)
        return M.add_(self.error[p]).clone()

    def _remember(self, p, compressed_input, result, Q):
        self.error[p] = compressed_input - result     # what compression left out, sent with the next step
        self.q[p] = Q

    @staticmethod
    def _orthonormal(P):
        return torch.linalg.qr(P).Q


def _average_exactly(tensors, group, world):
    """One all-reduce of the tensors concatenated, divided by the world size, written back."""
    flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else None
    if flat is None:
        return
    dist.all_reduce(flat, group=group)
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(part.view_as(t) / world)


def _all_reduce_all(tensors, group):
    """All-reduce (sum) a list of tensors as one flat buffer; returns the summed tensors."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    return [part.view_as(t) for t, part in zip(tensors, flat.split([t.numel() for t in tensors]))]


def _compress(state, mats, group, world):
    """One power iteration per matrix: P = orth(sum_i M_i Q); Q = mean_i M_i^T P; M ~ P Q^T."""
    inputs = [state._feed_back(p, M) for p, M in mats]
    Ps = [state._orthonormal(P) for P in _all_reduce_all([M @ state.q[p] for p, M in mats], group)]
    Qs = [Q / world for Q in _all_reduce_all([M.T @ P for (_, M), P in zip(mats, Ps)], group)]
    for (p, M), M_in, P, Q in zip(mats, inputs, Ps, Qs):
        M.copy_(P @ Q.T)                                      # into the bucket: the averaged approximation
        state._remember(p, M_in, M, Q)


def powersgd_hook(state: PowerSGDState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Rank-r PowerSGD with error feedback on every >= 2-D gradient; 1-D gradients averaged exactly."""
    group = state.process_group
    world = dist.get_world_size(group)
    pairs = list(zip(bucket.parameters(), bucket.gradients()))   # grads are views into bucket.buffer()
    _average_exactly([g for _, g in pairs if g.dim() <= 1], group, world)
    mats = [(p, g.view(g.shape[0], -1)) for p, g in pairs if g.dim() >= 2]
    if mats:
        _compress(state, mats, group, world)
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
