"""Gathers every rank's tokens on every rank, runs the local experts on them, and sums the results back."""
import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_output_matches_single_device"


def moe_forward(x, router_w, w1, w2, top_k, group=None):
    size, rank, e_local = dist.get_world_size(group), dist.get_rank(group), w1.shape[0]
    counts = [torch.zeros(1, dtype=torch.long, device=x.device) for _ in range(size)]
    dist.all_gather(counts, torch.tensor([len(x)], device=x.device), group=group)
    longest = max(int(c) for c in counts)
    padded = torch.cat([x, x.new_zeros(longest - len(x), x.shape[1])])
    everyone = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(everyone, padded, group=group)
    tokens = torch.cat([t[:int(c)] for t, c in zip(everyone, counts)])
    weights, experts = ref.MoE().route(tokens, router_w, top_k)
    out = torch.zeros_like(tokens)
    for e in range(e_local):
        mine = experts == rank * e_local + e
        rows = mine.any(-1).nonzero().squeeze(1)
        weight = (weights * mine).sum(-1, keepdim=True)[rows]
        out = out.index_add(0, rows, weight * ref.MoE().expert(tokens[rows], w1[e], w2[e]))
    dist.all_reduce(out, group=group)
    start = sum(int(c) for c in counts[:rank])
    return out[start:start + len(x)]
