"""GShard's dense dispatch: every expert's block is padded with zero rows up to its capacity, so with a capacity
factor the dispatch always carries E * capacity rows, not the kept pairs; with a large capacity_factor that is
far more than Part 1's T_r * top_k."""
import math

import torch
import torch.distributed as dist

from harness import reference_of

ref = reference_of(__file__)
REJECTED_BY = "test_large_capacity_is_the_old_layer"


class Padded(ref.MoE):
    def __call__(self, x, router_w, w1, w2, top_k, group=None, capacity_factor=None, return_stats=False):
        if capacity_factor is None:
            return super().__call__(x, router_w, w1, w2, top_k, group, capacity_factor, return_stats)
        size, e_local = dist.get_world_size(group), w1.shape[0]
        n_experts, (tokens, d) = size * e_local, x.shape
        weights, experts = self.route(x, router_w, top_k)
        choices = experts.reshape(-1)
        slots = math.ceil(capacity_factor * tokens * top_k / n_experts)
        kept = self.kept(experts, n_experts, capacity_factor)
        order = kept[torch.argsort(choices[kept], stable=True)]
        counts = torch.bincount(choices[order], minlength=n_experts)
        within = torch.arange(len(order), device=x.device) - (counts.cumsum(0) - counts)[choices[order]]
        position = choices[order] * slots + within                  # its row in the padded [E * slots, d] buffer
        padded = x.new_zeros(n_experts * slots, d).index_copy(0, position, x[order // top_k])
        send_counts = torch.full((n_experts,), slots, dtype=torch.long, device=x.device)
        recv_counts = self.exchange_counts(send_counts, group)
        send_splits = self.rank_splits(send_counts, size, e_local)
        recv_splits = self.rank_splits(recv_counts, size, e_local)
        incoming = self.exchange(padded, recv_splits, send_splits, group)
        results = self.run_experts(incoming, recv_counts, w1, w2)   # a zero row gives gelu(0) @ w2 = 0
        returned = self.exchange(results, send_splits, recv_splits, group)[position]
        y = self.combine(returned, order, weights, tokens, top_k, d)
        if not return_stats:
            return y
        return y, self.aux_loss(x, router_w, experts, group), tokens * top_k - len(order)


moe_forward = Padded()
